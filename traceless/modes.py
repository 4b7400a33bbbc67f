"""The engine's modes, each an Enum whose values are the words the command line and
`LLM(...)` accept. Base layer (no torch): EngineConfig's fields hold them, and the engine, the
runner and the model read the same members."""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from traceless.errors import ConfigError

M = TypeVar("M", bound=Enum)


class DType(Enum):
    """Activations and KV cache. AUTO: bfloat16 where the hardware runs it, else float32
    (runner/build.py compute_dtype)."""

    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class KVCacheDType(Enum):
    """The KV cache's dtype: the activations' own, or float16 under the CPU's float32 activations.
    AUTO: float16 where the weights run on the CPU's int8 kernels and attention on the native
    kernel (half the bytes a decoding step reads from the cache, as llama.cpp's default cache),
    else the activations' dtype (runner/build.py cache_dtype)."""

    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class QuantizationMode(Enum):
    """How weights are asked to be held; model/quantization.py resolves it to what they are."""

    AUTO = "auto"
    NONE = "none"
    GGUF = "gguf"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"
    FP8 = "fp8"


class LoadFormat(Enum):
    AUTO = "auto"  # the weights of a GGUF file or Hugging Face directory
    DUMMY = "dummy"  # random weights of the model's shapes (benchmarks only)


class AttentionBackend(Enum):
    AUTO = "auto"  # the device's own: NATIVE on the CPU (TORCH without the kernels), TRITON on CUDA
    NATIVE = "native"  # the CPU C kernels
    TORCH = "torch"  # SDPA and torch ops
    TRITON = "triton"  # the CUDA kernels


class CacheMode(Enum):
    """Prefix caching (engine/prefix_cache.py draws the domains)."""

    OFF = "off"
    ISOLATED = "isolated"  # shared only within a cache_salt, plus declared public prefixes
    GLOBAL = "global"  # one domain for everyone: the insecure baseline


class KVOffload(Enum):
    """Where a preempted request's sealed KV goes (runner/offload.py)."""

    NONE = "none"  # nothing: it is recomputed on resumption
    MEMORY = "memory"
    DISK = "disk"


class SpecMode(Enum):
    """Speculative decoding (engine/speculative.py says where drafts come from)."""

    OFF = "off"
    NGRAM = "ngram"
    DRAFT = "draft"


def choices(mode: type[Enum]) -> tuple[str, ...]:
    """The words a mode accepts, in declaration order (the command line's choices)."""
    return tuple(m.value for m in mode)


def as_mode(name: str, mode: type[M], value: object) -> M:
    """`value` as a member of `mode`: a member as it is, a word converted; anything else is a
    ConfigError naming option `name` and the words it takes (never the value given)."""
    if isinstance(value, mode):
        return value
    try:
        return mode(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{name} must be one of {', '.join(choices(mode))}") from None
