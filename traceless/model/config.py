"""Model hyper-parameters, parsed from a Hugging Face config.json or GGUF metadata.

Supported: the Llama family (Llama 2/3 incl. llama3 RoPE scaling, SmolLM2, Mistral) and Qwen2
(q/k/v bias), with GQA and tied embeddings. Anything else is refused with an error naming it.
"""
from __future__ import annotations

from dataclasses import dataclass

from traceless.errors import ModelLoadError, UnsupportedModelError

HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}


@dataclass(frozen=True, slots=True)
class RopeScaling:
    kind: str  # "linear" | "llama3"
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads ({self.num_heads}) is not a multiple of num_key_value_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim {self.head_dim} is odd; RoPE needs an even head_dim")

    @property
    def kv_bytes_per_token(self) -> int:
        """Elements of K and V per token over all layers (multiply by the element size)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim


def _rope_scaling_from_hf(raw: dict | None) -> RopeScaling | None:
    if not raw:
        return None
    kind = raw.get("rope_type", raw.get("type"))
    if kind in (None, "default"):
        return None
    if kind == "linear":
        return RopeScaling("linear", float(raw["factor"]))
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            float(raw["factor"]),
            float(raw.get("low_freq_factor", 1.0)),
            float(raw.get("high_freq_factor", 4.0)),
            int(raw.get("original_max_position_embeddings", 8192)),
        )
    raise UnsupportedModelError(f"unsupported rope_scaling type {kind!r} (supported: linear, llama3)")


def from_hf_config(cfg: dict) -> ModelConfig:
    archs = cfg.get("architectures") or []
    arch = next((HF_ARCHITECTURES[a] for a in archs if a in HF_ARCHITECTURES), None)
    if arch is None:
        raise UnsupportedModelError(
            f"unsupported architecture {', '.join(map(str, archs)) or '(none given)'}; "
            f"supported: {', '.join(HF_ARCHITECTURES)}"
        )
    if cfg.get("mlp_bias"):
        raise UnsupportedModelError("mlp_bias=true is not supported")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    rope = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if theta is None and isinstance(cfg.get("rope_parameters"), dict):  # transformers >= 5 layout
        rope = rope or cfg["rope_parameters"]
        theta = cfg["rope_parameters"].get("rope_theta")
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", arch == "mistral") else None
    return ModelConfig(
        architecture=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta if theta is not None else 10000.0),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        rope_scaling=_rope_scaling_from_hf(rope),
        sliding_window=int(window) if window else None,
    )


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
