"""Assemble the torch side of an engine from an EngineConfig: device, dtype, weights, KV cache,
attention backend, model runner, KV offload store; handed to the engine as `EngineParts`."""
from __future__ import annotations

import torch

from traceless.config import DEFAULT_CPU_KV_BYTES, EngineConfig
from traceless.engine.step_io import EngineParts, ModelInfo
from traceless.errors import ModelLoadError
from traceless.model.config import ModelConfig
from traceless.model.layers.attention import AttentionLayer, PagedAttention
from traceless.model.layers.kernels import KernelUnavailable, NativeKernels
from traceless.model.layers.kv_cache import KVCache, block_bytes
from traceless.model.layers.linear import weight_nbytes
from traceless.model.layers.ops import DecoderOps, NativeOps, TorchOps
from traceless.model.llama import LlamaModel
from traceless.model.loader import builtin_chat_template, is_gguf_model, load_model
from traceless.model.quantization import Quantization, resolve_quantization
from traceless.model.rope import Rope
from traceless.runner.model_runner import ModelRunner

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was requested but CUDA is not available")
    return device


def cpu_runs_bf16() -> bool:
    """Whether this CPU computes bfloat16 matmuls in hardware (AVX-512 BW/VL/DQ, with or without the
    BF16 extension, or AMX): oneDNN's packed bfloat16 weights need it. On an AVX2-only CPU bfloat16 is
    emulated element by element, slower than float32, and the packed path refuses to run."""
    return bool(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        # bfloat16 where the hardware runs it (every recent GPU, AVX-512/AMX CPUs); float32 elsewhere
        return torch.bfloat16 if device.type != "cpu" or cpu_runs_bf16() else torch.float32
    if name == "float16" and device.type == "cpu":
        raise ValueError("float16 is not supported on CPU; use bfloat16 or float32")
    return _DTYPES[name]


def _kv_budget(cfg: EngineConfig, device: torch.device, weight_bytes: int) -> int:
    """Bytes for the KV cache where no profiling pass sizes it (CPU, or an explicit size)."""
    if cfg.kv_cache_memory is not None:
        return cfg.kv_cache_memory
    if cfg.gpu_memory_utilization is not None:
        import os

        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * cfg.gpu_memory_utilization)
    return DEFAULT_CPU_KV_BYTES


def _attention_backend(cfg: EngineConfig, device: torch.device, dtype: torch.dtype) -> str:
    """"native" (CPU C kernel), "triton" (CUDA kernels) or "torch" (SDPA and torch ops)."""
    if device.type == "cpu":
        if cfg.attention_backend == "triton":
            raise ValueError("attention_backend='triton' runs on CUDA only")
        if cfg.attention_backend == "torch":
            return "torch"
        try:
            kernels = NativeKernels.load()
        except KernelUnavailable:
            if cfg.attention_backend == "native":
                raise
            return "torch"
        return "native" if kernels.supports(dtype) else "torch"
    if cfg.attention_backend == "native":
        raise ValueError("attention_backend='native' runs on CPU only")
    if cfg.attention_backend in ("triton", "auto"):
        try:
            import triton  # noqa: F401  (ships with torch's CUDA wheels)
        except ImportError:
            if cfg.attention_backend == "triton":
                raise ValueError("attention_backend='triton' needs the triton package") from None
            return "torch"
        return "triton"
    return "torch"


def _draft_layers(cfg: EngineConfig, mc: ModelConfig) -> int | None:
    """Self-speculation depth: the configured one, or a quarter of the model's layers."""
    if cfg.speculative != "draft":
        return None
    n = cfg.draft_layers if cfg.draft_layers is not None else max(1, mc.num_layers // 4)
    if n >= mc.num_layers:
        raise ValueError(f"draft_layers={n} must be below the model's {mc.num_layers} layers")
    return n


def _layers(backend: str, cache: KVCache, rope: Rope, mc: ModelConfig) -> tuple[AttentionLayer, DecoderOps]:
    heads = (mc.num_heads, mc.num_kv_heads, mc.head_dim)
    if backend == "triton":
        from traceless.model.layers.triton_ops import TritonAttention, TritonOps

        return TritonAttention(cache, heads), TritonOps(cache, rope, heads, mc.rms_norm_eps)
    if backend == "native":
        kernels = NativeKernels.load()
        return PagedAttention(cache, kernels, heads), NativeOps(kernels, cache, rope, heads, mc.rms_norm_eps)
    return PagedAttention(cache, None, heads), TorchOps(cache, rope, heads, mc.rms_norm_eps)


def _max_model_len(cfg: EngineConfig, mc: ModelConfig) -> int:
    limit = (mc.max_position_embeddings if mc.sliding_window is None
             else min(mc.max_position_embeddings, mc.sliding_window))
    max_model_len = cfg.max_model_len or limit
    if max_model_len > limit:
        raise ValueError(f"max_model_len {max_model_len} exceeds the model's context of {limit} tokens")
    return max_model_len


def _check_blocks(num_blocks: int, max_model_len: int, block_size: int) -> None:
    need = -(-max_model_len // block_size) + 1  # + the null block
    if num_blocks < need:
        raise ValueError(
            f"the KV cache budget holds {max(num_blocks - 1, 0) * block_size} tokens, fewer than "
            f"max_model_len={max_model_len}; raise kv_cache_memory or lower max_model_len"
        )


def _quantization(cfg: EngineConfig, device: torch.device) -> Quantization:
    if cfg.quantization == "none" or (cfg.quantization == "auto" and device.type != "cpu"):
        return Quantization.NONE
    try:
        NativeKernels.load()
        kernels = True
    except KernelUnavailable:
        kernels = False
    is_gguf = cfg.load_format == "auto" and is_gguf_model(cfg.model)
    return resolve_quantization(cfg.quantization, cfg.dtype, device.type, is_gguf, cfg.load_format, kernels)


def build_engine_parts(cfg: EngineConfig) -> EngineParts:
    device = resolve_device(cfg.device)
    quantization = _quantization(cfg, device)
    # quantized weights: the int8 kernels take and give float32 activations
    dtype = torch.float32 if quantization != Quantization.NONE else resolve_dtype(cfg.dtype, device)
    loaded = load_model(cfg.model, dtype, cfg.load_format, device, quantization)
    mc = loaded.config
    draft_layers = _draft_layers(cfg, mc)
    max_model_len = _max_model_len(cfg, mc)
    weight_bytes = sum(weight_nbytes(t) for t in loaded.weights.values())
    backend = _attention_backend(cfg, device, dtype)
    profile = device.type == "cuda" and cfg.kv_cache_memory is None
    bb = block_bytes(mc, cfg.block_size, dtype)
    # On CUDA the cache is sized after a profiling pass on a cache just big enough for it.
    num_blocks = (-(-cfg.max_num_batched_tokens // cfg.block_size) + 1 if profile
                  else _kv_budget(cfg, device, weight_bytes) // bb)
    if not profile:
        _check_blocks(num_blocks, max_model_len, cfg.block_size)
    cache = KVCache(mc, num_blocks, cfg.block_size, dtype, device)
    rope = Rope(mc, max_model_len, dtype, device, loaded.weights.get("rope_freqs"))
    attention, ops = _layers(backend, cache, rope, mc)
    pack = (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and cpu_runs_bf16())
    try:
        model = LlamaModel(mc, loaded.weights, attention, ops, device, pack)
    except RuntimeError as exc:  # e.g. out of memory while moving weights
        raise ModelLoadError(f"cannot place the model on {device} ({type(exc).__name__})") from None
    runner = ModelRunner(model, cfg.block_size, device, backend == "native", cfg.seed, draft_layers,
                         paged=backend == "triton")
    if profile:
        from traceless.runner.gpu_memory import kv_blocks_after_profile

        num_blocks = kv_blocks_after_profile(runner, cache, cfg, bb)
        _check_blocks(num_blocks, max_model_len, cfg.block_size)
        cache.resize(num_blocks)
    capture_s, num_graphs = 0.0, 0
    if device.type == "cuda" and backend == "triton" and not cfg.enforce_eager:
        from traceless.runner.cuda_graphs import DecodeGraphs, capture_sizes

        graphs = DecodeGraphs(model, capture_sizes(cfg.max_num_seqs), cfg.block_size, max_model_len, device,
                              mc.head_dim ** -0.5)
        capture_s, num_graphs = graphs.capture(), len(graphs.sizes)
        runner.graphs = graphs
    offload = None
    if cfg.kv_offload != "none":
        from traceless.runner.offload import KVOffloader

        offload = KVOffloader(cache, cfg.kv_offload, cfg.kv_offload_dir or _default_offload_dir())
    info = ModelInfo(name=loaded.name, path=str(loaded.path), vocab_size=mc.vocab_size, max_model_len=max_model_len,
                     num_layers=mc.num_layers, device=device.type, dtype=str(dtype).removeprefix("torch."),
                     attention=backend, load_format=cfg.load_format, cuda_graphs=num_graphs, capture_s=capture_s,
                     quantization=quantization.value)
    template = cfg.chat_template
    if template is None and cfg.model is None and cfg.load_format == "auto":
        template = builtin_chat_template("smollm2-tools")
    if template is not None:
        loaded.tokenizer.set_chat_template(template)
    return EngineParts(runner, cache, loaded.tokenizer, info, offload)


def _default_offload_dir() -> str:
    """A private spill directory for this process, removed at exit (it is empty by then: every
    spill file is unlinked when its request resumes or ends)."""
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="traceless-kv-")
    atexit.register(shutil.rmtree, path, True)
    return path
