"""Engine options shared by every command that starts an engine (serve, node, bench, chat)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from traceless.modes import (
    AttentionBackend,
    CacheMode,
    DType,
    KVCacheDType,
    KVOffload,
    LoadFormat,
    QuantizationMode,
    SpecMode,
    choices,
)


def parse_size(text: str) -> int:
    """'2GiB', '512MiB', '1.5G', '1000000' -> bytes."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 2GiB, 512MiB)") from None


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--model", default=None, help="GGUF file or Hugging Face directory (default: built-in SmolLM2-135M-Instruct)"
    )
    g.add_argument(
        "--dtype",
        default="auto",
        choices=choices(DType),
        help="activations and KV cache (auto: bfloat16 on GPUs and AVX-512 CPUs, else float32); "
        "given explicitly with a GGUF file under --quantization auto, it dequantizes the weights "
        "to this type (exact parity runs)",
    )
    g.add_argument(
        "--quantization",
        default="auto",
        choices=choices(QuantizationMode),
        help="how weights are held. auto: a GGUF file on the CPU keeps its own blocks (Q8_0, Q4_0, "
        "Q4_1, Q4_K, Q5_K, Q6_K; other types are dequantized) unless --dtype is given; an FP8 "
        "checkpoint runs its matmuls in FP8 on CUDA and is dequantized on the CPU; other "
        "checkpoints stay dense. gguf (CPU): keep a GGUF file's blocks. q8_0, q4_0 (CPU): "
        "quantize a Hugging Face checkpoint at load, int8 kernels with float32 activations. "
        "fp8 (CUDA): quantize a checkpoint's layer matrices to FP8 at load, per output "
        "channel, activations per token. none: dense weights (an FP8 checkpoint dequantized)",
    )
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    g.add_argument(
        "--kv-cache-memory",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="KV cache size, e.g. 2GiB (default: on CUDA what --gpu-memory-utilization leaves after a "
        "profiling pass; on the CPU --max-num-seqs sequences of 1/32 of --max-model-len each, at "
        "least one --max-model-len sequence, at most 2GiB; the engine.ready event says what it "
        "chose)",
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        metavar="FRACTION",
        help="CUDA: the fraction of the device's memory for weights and KV cache (default 0.9). Not "
        "for the CPU (refused there): the CPU's KV cache is sized from --max-model-len and "
        "--max-num-seqs, or set with --kv-cache-memory",
    )
    g.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="longest sequence (prompt + output) in tokens (default: the model's context)",
    )
    g.add_argument("--max-num-seqs", type=int, default=128, help="most requests in one running batch")
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="most tokens one engine step computes (longer prompts are prefilled in chunks)",
    )
    g.add_argument(
        "--max-queued-requests",
        type=int,
        default=1024,
        help="requests the engine holds at most; beyond them a 503 with Retry-After",
    )
    g.add_argument(
        "--attention-backend",
        default="auto",
        choices=choices(AttentionBackend),
        help="native: the CPU C kernel; triton: the CUDA kernels; torch: SDPA (auto: the device's own)",
    )
    g.add_argument(
        "--load-format",
        default="auto",
        choices=choices(LoadFormat),
        help="dummy: random weights of the shapes in --model's config.json (benchmarks only)",
    )
    g.add_argument(
        "--enforce-eager", action="store_true", help="CUDA: run decode steps eagerly instead of replaying CUDA graphs"
    )
    g.add_argument(
        "--async-scheduling",
        action="store_true",
        help="schedule and launch each step before reading the last one's tokens (stop checks a "
        "step late; requests needing their tokens on the host run synchronously)",
    )
    g.add_argument(
        "--prefix-cache",
        default="isolated",
        choices=choices(CacheMode),
        help="isolated: share only within a cache_salt (default); global: vLLM-style shared cache "
        "(insecure baseline); off",
    )
    g.add_argument(
        "--prefix-cache-ttl", type=float, default=60.0, help="seconds a cached block lives after its last use"
    )
    g.add_argument(
        "--kv-offload",
        default="none",
        choices=choices(KVOffload),
        help="on preemption, seal the request's KV (AES-256-GCM, per-request key) instead of recomputing",
    )
    g.add_argument("--kv-offload-dir", default=None, help="spill directory for --kv-offload disk")
    g.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=choices(KVCacheDType),
        help="the KV cache's dtype (auto: float16 on the CPU when the weights stay quantized and "
        "attention runs on the native kernel, as llama.cpp's cache; else the activations' dtype). "
        "float16 under the CPU's float32 activations halves the bytes a decoding step reads",
    )
    g.add_argument(
        "--public-prefix",
        action="append",
        default=[],
        metavar="FILE",
        help="an exact system prompt (not user data) that all domains may share; repeatable",
    )
    g.add_argument(
        "--speculative",
        default="off",
        choices=choices(SpecMode),
        help="speculative decoding: ngram (prompt lookup in the request's own tokens), draft "
        "(self-speculation on the model's first layers) or off",
    )
    g.add_argument("--num-speculative-tokens", type=int, default=4, help="draft tokens verified per step at most")
    g.add_argument("--ngram-min", type=int, default=2, help="shortest suffix prompt lookup matches")
    g.add_argument("--ngram-max", type=int, default=4, help="longest suffix prompt lookup matches (tried first)")
    g.add_argument(
        "--draft-layers",
        type=int,
        default=None,
        help="layers of the self-speculation draft (default: a quarter of the model's)",
    )
    g.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template to use instead of the model's own (the built-in model uses "
        "traceless/model/templates/smollm2-tools.jinja, which adds its tool-call format)",
    )
    g.add_argument(
        "--request-events",
        action="store_true",
        help="log each request's exact token counts and timings (request.finished) and, on a node, "
        "one line per HTTP request (http.request, http.error): for benchmarks only, never on a "
        "production node (off by default, measured; see docs/telemetry.md)",
    )


def engine_options(args: argparse.Namespace) -> dict:
    """EngineConfig keyword arguments other than model and dtype."""
    return dict(
        device=args.device,
        block_size=args.block_size,
        kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_queued_requests=args.max_queued_requests,
        attention_backend=args.attention_backend,
        prefix_cache=args.prefix_cache,
        prefix_cache_ttl=args.prefix_cache_ttl,
        public_prefixes=tuple(Path(f).read_text() for f in args.public_prefix),
        kv_offload=args.kv_offload,
        kv_offload_dir=args.kv_offload_dir,
        kv_cache_dtype=args.kv_cache_dtype,
        speculative=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens,
        ngram_min=args.ngram_min,
        ngram_max=args.ngram_max,
        draft_layers=args.draft_layers,
        request_events=args.request_events,
        load_format=args.load_format,
        enforce_eager=args.enforce_eager,
        async_scheduling=args.async_scheduling,
        chat_template=read_chat_template(args.chat_template),
        quantization=args.quantization,
    )


def read_chat_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"--chat-template: cannot read {path} ({type(exc).__name__})") from None


@contextmanager
def config_errors() -> Iterator[None]:
    """Building an engine from the options: a value the engine refuses (EngineConfig's checks, a
    --max-model-len beyond the model's context, a KV budget too small) or a model that cannot be
    found or loaded is the user's configuration, reported as ConfigError (one line, status 2)."""
    from traceless.errors import ConfigError, TracelessError

    try:
        yield
    except ConfigError:
        raise
    except (ValueError, TracelessError) as exc:
        raise ConfigError(str(exc)) from exc
