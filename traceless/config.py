"""Engine configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from traceless.errors import ConfigError
from traceless.modes import (
    AttentionBackend,
    CacheMode,
    DType,
    KVCacheDType,
    KVOffload,
    LoadFormat,
    QuantizationMode,
    SpecMode,
    as_mode,
)

DEFAULT_CPU_KV_BYTES = 2 * 2**30
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
    kv_cache_dtype: the KV cache's dtype (modes.KVCacheDType): "auto" is float16 on the CPU when the
    weights run on its int8 kernels and attention on the native kernel, else the activations'
    dtype; "float16" under float32 activations on the CPU, or the activations' dtype by name.
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
    "none": dense weights in dtype (an FP8 checkpoint dequantized).
    The mode fields (dtype, attention_backend, prefix_cache, kv_offload, kv_cache_dtype,
    speculative, load_format, quantization) hold traceless.modes' Enums; each also takes its
    value's word ("global"), which is converted on construction; any other value is a ConfigError
    naming the words allowed."""

    model: str | None = None
    dtype: DType = DType.AUTO
    device: str = "auto"
    block_size: int = 16
    kv_cache_memory: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_queued_requests: int = 1024
    attention_backend: AttentionBackend = AttentionBackend.AUTO
    seed: int | None = None
    prefix_cache: CacheMode = CacheMode.ISOLATED
    prefix_cache_ttl: float = 60.0
    public_prefixes: tuple[str, ...] = ()
    kv_offload: KVOffload = KVOffload.NONE
    kv_offload_dir: str | None = None
    kv_cache_dtype: KVCacheDType = KVCacheDType.AUTO
    speculative: SpecMode = SpecMode.OFF
    num_speculative_tokens: int = 4
    ngram_min: int = 2
    ngram_max: int = 4
    draft_layers: int | None = None
    request_events: bool = False
    load_format: LoadFormat = LoadFormat.AUTO
    enforce_eager: bool = False
    async_scheduling: bool = False
    chat_template: str | None = None
    quantization: QuantizationMode = QuantizationMode.AUTO

    def __post_init__(self) -> None:
        # One check per field, in this order: the first invalid field is the one named.
        self._check_formats()
        self._check_cache()
        self._check_layout_and_sizes()
        self._check_speculative()

    def _mode(self, name: str, mode: type[Enum]) -> None:
        """Field `name` as a member of `mode`: a member stays, its value's word is converted."""
        object.__setattr__(self, name, as_mode(name, mode, getattr(self, name)))  # frozen: set while constructing

    def _check_formats(self) -> None:
        self._mode("load_format", LoadFormat)
        self._mode("dtype", DType)
        self._mode("quantization", QuantizationMode)
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError("device must be auto, cpu, cuda or cuda:N")

    def _check_cache(self) -> None:
        self._mode("prefix_cache", CacheMode)
        if self.prefix_cache_ttl < 0:
            raise ConfigError("prefix_cache_ttl must be >= 0")
        if self.public_prefixes and self.prefix_cache is not CacheMode.ISOLATED:
            raise ConfigError("public prefixes are declared for the isolated prefix cache only")
        self._mode("kv_offload", KVOffload)
        self._mode("kv_cache_dtype", KVCacheDType)
        if self.kv_offload_dir is not None and self.kv_offload is not KVOffload.DISK:
            raise ConfigError("kv_offload_dir is for kv_offload='disk'")

    def _check_layout_and_sizes(self) -> None:
        self._mode("attention_backend", AttentionBackend)
        if not 1 <= self.block_size <= 256:
            raise ConfigError("block_size must be between 1 and 256")
        if self.kv_cache_memory is not None and self.gpu_memory_utilization is not None:
            raise ConfigError("give kv_cache_memory or gpu_memory_utilization, not both")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ConfigError("kv_cache_memory must be positive")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError("gpu_memory_utilization must be in (0, 1]")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError("max_model_len must be at least 2")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_queued_requests"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")

    def _check_speculative(self) -> None:
        self._mode("speculative", SpecMode)
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"num_speculative_tokens must be between 1 and {MAX_SPECULATIVE_TOKENS}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError("ngram_min and ngram_max must satisfy 1 <= ngram_min <= ngram_max")
        if self.draft_layers is not None and self.draft_layers < 1:
            raise ConfigError("draft_layers must be at least 1 (and below the model's layer count)")
        if self.async_scheduling and self.speculative is not SpecMode.OFF:
            raise ConfigError("async_scheduling runs without speculative decoding (drafts need the host's tokens)")
        if self.draft_layers is not None and self.speculative is not SpecMode.DRAFT:
            raise ConfigError("draft_layers applies to speculative='draft' only")
