"""GGUF metadata -> ModelConfig (llama.cpp's key names, `<arch>.<field>`).

llama.cpp's converter leaves some of a family's facts out of the file and its runtime supplies
them; we do the same where it does:
  gemma3  norm weights are stored as 1 + w (the converter adds the one); local layers every layer
          but each 6th (`attention.sliding_window_pattern` when given), their rope base 10000
          (`rope.freq_base_swa` when given); attention scale 1/sqrt(head size), except the 62-layer
          (27B) model's 1/sqrt(hidden / heads); embeddings times sqrt(hidden); gelu_tanh.
  phi3    qkv and gate/up fused (`attn_qkv`, `ffn_up` of 2 x feed_forward_length rows); LongRoPE
          factors as the tensors rope_factors_short/long; `attention.sliding_window` 0 = none.
  qwen3   per-head q/k norms (`attn_q_norm`, `attn_k_norm`).
"""

from __future__ import annotations

import math

import numpy as np

from traceless.errors import ModelLoadError, UnsupportedModelError
from traceless.model.config import Activation, ModelConfig, RopeScaling

GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3", "phi3": "phi3"}
GEMMA3_PATTERN, GEMMA3_LOCAL_BASE = 6, 10000.0  # llama.cpp's values when the file does not give them


class _Meta:
    """`<arch>.<name>` lookups that refuse a missing required key by name."""

    def __init__(self, meta: dict, arch: str):
        self.meta, self.arch = meta, arch

    def __call__(self, name: str, default=None):
        value = self.meta.get(f"{self.arch}.{name}", default)
        if value is None:
            raise UnsupportedModelError(f"GGUF metadata lacks {self.arch}.{name}")
        return value

    def get(self, name: str, default=None):
        return self.meta.get(f"{self.arch}.{name}", default)


def from_gguf_metadata(
    meta: dict, has_output_weight: bool, has_qkv_bias: bool, rope_factors: dict[str, np.ndarray] | None = None
) -> ModelConfig:
    """rope_factors: the file's rope_factors_short/long tensors by those names (phi3 LongRoPE)."""
    raw_arch = meta.get("general.architecture")
    arch = GGUF_ARCHITECTURES.get(raw_arch) if isinstance(raw_arch, str) else None
    if arch is None:
        raise UnsupportedModelError(
            f"unsupported GGUF architecture {raw_arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    key = _Meta(meta, arch)
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    if heads < 1 or kv_heads < 1:
        raise UnsupportedModelError(f"GGUF {arch}.attention.head_count and head_count_kv must be at least 1")
    head_dim = int(key.get("attention.key_length") or hidden // heads)
    rotary = key.get("rope.dimension_count")
    rotary = int(rotary) if rotary is not None else head_dim
    if rotary != head_dim and arch != "phi3":
        raise UnsupportedModelError(
            f"GGUF {arch}.rope.dimension_count ({rotary}) differs from the head size ({head_dim}): "
            "partial rotary embeddings are supported for phi3 only"
        )
    vocab = key.get("vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
    if not vocab:
        raise ModelLoadError(f"GGUF metadata gives no vocabulary size ({arch}.vocab_size or tokenizer.ggml.tokens)")
    n_layers = int(key("block_count"))
    base = ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings=not has_output_weight,
        qkv_bias=has_qkv_bias,
        rope_scaling=_scaling(key, rope_factors or {}),
        rotary_dim=None if rotary == head_dim else rotary,
        qk_norm=arch == "qwen3",
    )
    if arch == "gemma3":
        return _gemma3(key, base)
    if arch == "phi3":
        window = int(key.get("attention.sliding_window") or 0)
        return _replace(base, layer_windows=(window,) * n_layers if window else ())
    return base


def _replace(c: ModelConfig, **changes) -> ModelConfig:
    from dataclasses import replace

    return replace(c, **changes)


def _gemma3(key: _Meta, c: ModelConfig) -> ModelConfig:
    window = int(key("attention.sliding_window"))
    pattern = key.get("attention.sliding_window_pattern", GEMMA3_PATTERN)
    if isinstance(pattern, (list, tuple)):  # per-layer flags (newer converters)
        sliding = [bool(x) for x in pattern]
    else:
        sliding = [bool((i + 1) % int(pattern)) for i in range(c.num_layers)]
    scalar = c.hidden_size / c.num_heads if c.num_layers == 62 else c.head_dim
    return _replace(
        c,
        layer_windows=tuple(window if s else 0 for s in sliding),
        local_rope_theta=float(key.get("rope.freq_base_swa", GEMMA3_LOCAL_BASE)),
        activation=Activation.GELU_TANH,
        qk_norm=True,
        sandwich_norms=True,
        embed_scale=math.sqrt(c.hidden_size),
        query_pre_attn_scalar=float(scalar),
    )


def _scaling(key: _Meta, factors: dict[str, np.ndarray]) -> RopeScaling | None:
    kind = key.get("rope.scaling.type")
    if "rope_factors_long" in factors or "rope_factors_short" in factors:
        return _longrope(key, factors)
    if kind == "linear":
        return RopeScaling("linear", float(key("rope.scaling.factor")))
    if kind not in (None, "none"):
        raise UnsupportedModelError(f"unsupported GGUF rope scaling {kind!r}")
    return None


def _longrope(key: _Meta, factors: dict[str, np.ndarray]) -> RopeScaling:
    if key.arch != "phi3":
        raise UnsupportedModelError(f"GGUF {key.arch}: rope_factors tensors are supported for phi3 only")
    try:
        short, long = factors["rope_factors_short"], factors["rope_factors_long"]
    except KeyError:
        raise UnsupportedModelError("GGUF phi3 has one of rope_factors_short/long without the other") from None
    original = int(key("rope.scaling.original_context_length"))
    factor = int(key("context_length")) / original
    attention = key.get("rope.scaling.attn_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling(
        "longrope",
        factor,
        original_max_position_embeddings=original,
        short_factor=tuple(float(x) for x in short),
        long_factor=tuple(float(x) for x in long),
        attention_factor=float(attention),
    )
