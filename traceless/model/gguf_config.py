"""GGUF metadata -> ModelConfig (llama.cpp's key names, `<arch>.<field>`)."""
from __future__ import annotations

from traceless.errors import ModelLoadError, UnsupportedModelError
from traceless.model.config import ModelConfig, RopeScaling

GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}


def from_gguf_metadata(meta: dict, has_output_weight: bool, has_qkv_bias: bool) -> ModelConfig:
    raw_arch = meta.get("general.architecture")
    arch = GGUF_ARCHITECTURES.get(raw_arch) if isinstance(raw_arch, str) else None
    if arch is None:
        raise UnsupportedModelError(
            f"unsupported GGUF architecture {raw_arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )

    def key(name: str, default=None):
        value = meta.get(f"{raw_arch}.{name}", default)
        if value is None:
            raise UnsupportedModelError(f"GGUF metadata lacks {raw_arch}.{name}")
        return value

    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    if heads < 1 or kv_heads < 1:
        raise UnsupportedModelError(f"GGUF {raw_arch}.attention.head_count and head_count_kv must be at least 1")
    head_dim = int(meta.get(f"{raw_arch}.attention.key_length") or hidden // heads)
    rotary = meta.get(f"{raw_arch}.rope.dimension_count")
    if rotary is not None and int(rotary) != head_dim:
        raise UnsupportedModelError(
            f"GGUF {raw_arch}.rope.dimension_count ({int(rotary)}) differs from the head size ({head_dim}): "
            "partial rotary embeddings are not supported"
        )
    scaling = None
    kind = meta.get(f"{raw_arch}.rope.scaling.type")
    if kind == "linear":
        scaling = RopeScaling("linear", float(key("rope.scaling.factor")))
    elif kind not in (None, "none"):
        raise UnsupportedModelError(f"unsupported GGUF rope scaling {kind!r}")
    vocab = meta.get(f"{raw_arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or ())
    if not vocab:
        raise ModelLoadError(f"GGUF metadata gives no vocabulary size ({raw_arch}.vocab_size or tokenizer.ggml.tokens)")
    return ModelConfig(
        architecture=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position_embeddings=int(key("context_length")),
        tie_word_embeddings=not has_output_weight,
        qkv_bias=has_qkv_bias,
        rope_scaling=scaling,
    )
