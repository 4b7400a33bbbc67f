"""Engine configuration: one frozen dataclass, validated on construction."""
from __future__ import annotations

from dataclasses import dataclass

ATTENTION_BACKENDS = ("auto", "native", "torch", "triton")
LOAD_FORMATS = ("auto", "dummy")
PREFIX_CACHE_MODES = ("off", "isolated", "global")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("auto", "none", "gguf", "q8_0", "q4_0", "fp8")
DEFAULT_CPU_KV_BYTES = 2 * 2**30
SPECULATIVE_MODES = ("off", "ngram", "draft")
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """model: GGUF file or HF directory (None = the built-in default model).
    kv_cache_memory: bytes for the KV cache; or gpu_memory_utilization: on CUDA the fraction of
    device memory for weights + KV cache (refused on the CPU). Neither: on CUDA 0.9; on the CPU
    what max_num_seqs sequences can use of max_model_len (runner/kv_budget.py), at most 2 GiB.
    prefix_cache: "isolated" (default: sharing only between requests with the same cache_salt, plus
    `public_prefixes`, exact operator system prompts), "global" (vLLM-style shared cache: the
    insecure baseline for benchmarks and attack demos) or "off"; cached blocks expire after
    prefix_cache_ttl seconds.
    speculative: "ngram" (prompt lookup: drafts copied from the request's own earlier tokens, the
    last n in [ngram_min, ngram_max] matched), "draft" (self-speculation: the model's first
    draft_layers layers, default a quarter of them, propose) or "off"; each decoding step verifies
    up to num_speculative_tokens drafts. Drafts never come from anything shared across requests.
    request_events: log a `request.finished` event with each request's exact token counts and
    timings. Off by default (a per-request record); the "off" switch of windowed telemetry, for
    benchmarks that break a request's time down, never for a production node.
    chat_template: a Jinja chat template (its text) used instead of the model's own; None: the
    model's own, except the built-in model, which uses templates/smollm2-tools.jinja (its GGUF's
    template plus SmolLM2's tool-call format, identical without tools).
    quantization: how weights are held (model/quantization.py has the rule). "auto": a GGUF file
    on the CPU keeps its quantized blocks when dtype is "auto" (an explicit dtype dequantizes to
    it, as for exact parity runs); an FP8 checkpoint runs its matmuls in FP8 on CUDA and is
    dequantized on the CPU; other checkpoints stay dense. "gguf": keep a GGUF file's blocks;
    "q8_0"/"q4_0": quantize a Hugging Face checkpoint at load (CPU); "fp8" (CUDA): quantize a
    checkpoint's layer matrices to FP8 at load, per output channel, activations per token;
    "none": dense weights in dtype (an FP8 checkpoint dequantized)."""

    model: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_queued_requests: int = 1024
    attention_backend: str = "auto"
    seed: int | None = None
    prefix_cache: str = "isolated"
    prefix_cache_ttl: float = 60.0
    public_prefixes: tuple[str, ...] = ()
    kv_offload: str = "none"
    kv_offload_dir: str | None = None
    speculative: str = "off"
    num_speculative_tokens: int = 4
    ngram_min: int = 2
    ngram_max: int = 4
    draft_layers: int | None = None
    request_events: bool = False
    load_format: str = "auto"
    enforce_eager: bool = False
    async_scheduling: bool = False
    chat_template: str | None = None
    quantization: str = "auto"

    def __post_init__(self) -> None:
        # One check per field, in this order: the first invalid field is the one named.
        self._check_formats()
        self._check_cache()
        self._check_layout_and_sizes()
        self._check_speculative()

    def _check_formats(self) -> None:
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError("device must be auto, cpu, cuda or cuda:N")

    def _check_cache(self) -> None:
        if self.prefix_cache not in PREFIX_CACHE_MODES:
            raise ValueError(f"prefix_cache must be one of {', '.join(PREFIX_CACHE_MODES)}")
        if self.prefix_cache_ttl < 0:
            raise ValueError("prefix_cache_ttl must be >= 0")
        if self.public_prefixes and self.prefix_cache != "isolated":
            raise ValueError("public prefixes are declared for the isolated prefix cache only")
        if self.kv_offload not in ("none", "memory", "disk"):
            raise ValueError("kv_offload must be none, memory or disk")
        if self.kv_offload_dir is not None and self.kv_offload != "disk":
            raise ValueError("kv_offload_dir is for kv_offload='disk'")

    def _check_layout_and_sizes(self) -> None:
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}")
        if not 1 <= self.block_size <= 256:
            raise ValueError("block_size must be between 1 and 256")
        if self.kv_cache_memory is not None and self.gpu_memory_utilization is not None:
            raise ValueError("give kv_cache_memory or gpu_memory_utilization, not both")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError("kv_cache_memory must be positive")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_queued_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")

    def _check_speculative(self) -> None:
        if self.speculative not in SPECULATIVE_MODES:
            raise ValueError(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be between 1 and {MAX_SPECULATIVE_TOKENS}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("ngram_min and ngram_max must satisfy 1 <= ngram_min <= ngram_max")
        if self.draft_layers is not None and self.draft_layers < 1:
            raise ValueError("draft_layers must be at least 1 (and below the model's layer count)")
        if self.async_scheduling and self.speculative != "off":
            raise ValueError("async_scheduling runs without speculative decoding (drafts need the host's tokens)")
        if self.draft_layers is not None and self.speculative != "draft":
            raise ValueError("draft_layers applies to speculative='draft' only")
