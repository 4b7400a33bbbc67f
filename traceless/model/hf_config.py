"""A Hugging Face config.json -> ModelConfig, family by family (see model/config.py's table).

Defaults follow transformers' config classes for the fields a published config.json may leave
out (Gemma 3's text_config, for one, gives only what differs from Gemma3TextConfig). Anything
the decoder cannot run is refused with an error that names the architecture or the field.
"""

from __future__ import annotations

import math

from traceless.errors import UnsupportedModelError
from traceless.model.config import Activation, ModelConfig, RopeScaling
from traceless.model.fp8.config import Fp8Config, parse_fp8_config
from traceless.model.moe_checkpoint import moe_spec

HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # the text model of the checkpoint (text_config)
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GptOssForCausalLM": "gpt_oss",
}
_GEMMA = {
    "hidden_activation": "gelu_pytorch_tanh",
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "sliding_window": 4096,
}
# transformers' defaults for fields a config.json may omit
_DEFAULTS: dict[str, dict] = {
    "llama": {},
    "mistral": {},
    "qwen2": {},
    "qwen3": {"head_dim": 128},
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe": {"num_experts_per_tok": 8, "norm_topk_prob": False, "decoder_sparse_step": 1},
    "gpt_oss": {
        "head_dim": 64,
        "sliding_window": 128,
        "attention_bias": True,
        "rms_norm_eps": 1e-5,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
        "swiglu_limit": 7.0,
    },
    "phi3": {"original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5},
    "gemma2": _GEMMA
    | {
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
        "rope_theta": 10000.0,
    },
    "gemma3": _GEMMA
    | {
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window_pattern": 6,
    },
}
_ACTIVATIONS = {"silu": Activation.SILU, "gelu_pytorch_tanh": Activation.GELU_TANH}
_LAYER_TYPES = ("sliding_attention", "full_attention")
# fields whose explicit null turns a family default off (elsewhere null means "the default")
_NULLABLE = ("sliding_window", "attn_logit_softcapping", "final_logit_softcapping")


def from_hf_config(raw: dict) -> ModelConfig:
    archs = raw.get("architectures") or []
    found = next((a for a in archs if a in HF_ARCHITECTURES), None)
    if found is None:
        raise UnsupportedModelError(
            f"unsupported architecture {', '.join(map(str, archs)) or '(none given)'}; "
            f"supported: {', '.join(HF_ARCHITECTURES)}"
        )
    arch = HF_ARCHITECTURES[found]
    if found == "Gemma3ForConditionalGeneration":
        raw = raw.get("text_config") or {}
    cfg = _DEFAULTS[arch] | {k: v for k, v in raw.items() if v is not None or k in _NULLABLE}
    _refuse_unsupported(arch, cfg)
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    theta, scaling, local_theta, partial = _rope(arch, cfg)
    rotary = int(head_dim * partial) if partial != 1.0 else None
    gemma = arch in ("gemma2", "gemma3")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if act not in _ACTIVATIONS:
        raise UnsupportedModelError(f"unsupported hidden_act {act!r} (supported: {', '.join(_ACTIVATIONS)})")
    return ModelConfig(
        architecture=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        o_bias=arch == "gpt_oss" and bool(cfg.get("attention_bias", False)),
        attn_sinks=arch == "gpt_oss",
        rope_scaling=scaling,
        layer_windows=_layer_windows(arch, cfg),
        local_rope_theta=local_theta,
        rotary_dim=rotary,
        activation=_ACTIVATIONS[act],
        norm_offset=1.0 if gemma else 0.0,
        qk_norm=arch in ("qwen3", "qwen3_moe", "gemma3"),
        sandwich_norms=gemma,
        embed_scale=math.sqrt(hidden) if gemma else None,
        query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]) if gemma else None,
        attn_softcap=_positive(cfg, "attn_logit_softcapping") if arch == "gemma2" else None,
        final_softcap=_positive(cfg, "final_logit_softcapping") if gemma else None,
        moe=moe_spec(cfg | {"architectures": [found]}),
        fp8=_quantization(arch, cfg),
    )


def _refuse_unsupported(arch: str, cfg: dict) -> None:
    if cfg.get("mlp_bias"):
        raise UnsupportedModelError("mlp_bias=true is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise UnsupportedModelError(f"{arch}: use_bidirectional_attention=true is not supported")
    if arch == "gemma3" and cfg.get("attn_logit_softcapping") is not None:
        # transformers' Gemma 3 does not apply it: running it would differ, ignoring it is not ours to do
        raise UnsupportedModelError("gemma3: attn_logit_softcapping is not supported")
    if arch in ("qwen2", "qwen3") and cfg.get("use_sliding_window") and "layer_types" not in cfg:
        if cfg.get("max_window_layers") is None:
            raise UnsupportedModelError(f"{arch}: use_sliding_window=true needs max_window_layers")


def _quantization(arch: str, cfg: dict) -> Fp8Config | None:
    """The checkpoint's FP8 form, or None for unquantized weights. Any other quantization is
    refused naming the field (a quantized checkpoint must never load as if it were not)."""
    raw = cfg.get("quantization_config")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise UnsupportedModelError("quantization_config must be an object")
    if raw.get("quant_method") == "mxfp4":
        # gpt-oss publishes its experts in MXFP4 (<proj>_blocks / _scales), dequantized at load
        if arch != "gpt_oss":
            raise UnsupportedModelError(
                f"quantization_config.quant_method 'mxfp4' is read for gpt-oss only, not {arch}"
            )
        unknown = sorted(set(raw) - {"quant_method", "modules_to_not_convert"})
        if unknown:
            raise UnsupportedModelError(f"quantization_config has unsupported key(s): {', '.join(unknown)}")
        return None
    return parse_fp8_config(raw)


def _positive(cfg: dict, key: str) -> float | None:
    value = cfg.get(key)
    if value is None:
        return None
    if float(value) <= 0:
        raise UnsupportedModelError(f"{key} must be positive")
    return float(value)


def _layer_windows(arch: str, cfg: dict) -> tuple[int, ...]:
    """Per layer: the sliding window (0: global attention), as transformers lays the layers out."""
    n = int(cfg["num_hidden_layers"])
    window = int(cfg.get("sliding_window") or 0)
    if arch in ("qwen2", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window"):
        window = 0
    types = cfg.get("layer_types")
    if types is None:
        if arch in ("mistral", "phi3", "mixtral", "qwen3_moe"):  # qwen3_moe: no max_window_layers
            sliding = [True] * n
        elif arch in ("qwen2", "qwen3"):
            sliding = [i >= int(cfg.get("max_window_layers") or 0) for i in range(n)]
        elif arch == "gemma2":
            sliding = [bool((i + 1) % 2) for i in range(n)]
        elif arch == "gemma3":
            pattern = int(cfg["sliding_window_pattern"])
            sliding = [bool((i + 1) % pattern) for i in range(n)]
        else:
            sliding = [False] * n
    else:
        bad = sorted({str(t) for t in types} - set(_LAYER_TYPES))
        if bad:
            raise UnsupportedModelError(
                f"unsupported layer_types {', '.join(bad)} (supported: {', '.join(_LAYER_TYPES)})"
            )
        if len(types) != n:
            raise UnsupportedModelError(f"layer_types lists {len(types)} layers for num_hidden_layers={n}")
        sliding = [t == "sliding_attention" for t in types]
    if not window or not any(sliding):
        return ()
    return tuple(window if s else 0 for s in sliding)


def _rope(arch: str, cfg: dict) -> tuple[float, RopeScaling | None, float | None, float]:
    """(base of global layers, their scaling, base of windowed layers or None, partial rotary factor).
    Reads both layouts: rope_theta/rope_scaling (config.json as published) and transformers 5's
    rope_parameters, flat or per layer type (Gemma 3)."""
    params: dict = cfg["rope_parameters"] if isinstance(cfg.get("rope_parameters"), dict) else {}
    nested = any(t in params for t in _LAYER_TYPES)
    full: dict = (params.get("full_attention") or {}) if nested else params
    raw = cfg.get("rope_scaling") or full
    theta = full["rope_theta"] if "rope_theta" in full else cfg.get("rope_theta", 10000.0)
    local = None
    if arch == "gemma3":
        local_params: dict = (params.get("sliding_attention") or {}) if nested else {}
        if local_params.get("rope_type", "default") != "default":
            raise UnsupportedModelError("gemma3: rope scaling on the sliding-window layers is not supported")
        local = float(local_params.get("rope_theta", cfg["rope_local_base_freq"]))
    partial = float(cfg.get("partial_rotary_factor", full.get("partial_rotary_factor", 1.0)))
    return float(theta), _scaling(arch, raw, cfg), local, partial


def _scaling(arch: str, raw: dict | None, cfg: dict) -> RopeScaling | None:
    if not raw:
        return None
    kind = raw.get("rope_type", raw.get("type"))
    if arch == "phi3" and kind in ("su", "yarn"):
        kind = "longrope"  # as transformers' Phi3Config renames them
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
    if kind == "longrope":
        return _longrope(raw, cfg)
    if kind == "yarn":
        return _yarn(raw, cfg)
    raise UnsupportedModelError(f"unsupported rope_scaling type {kind!r} (supported: linear, llama3, longrope, yarn)")


def _yarn(raw: dict, cfg: dict) -> RopeScaling:
    """transformers' _compute_yarn_parameters: the factor defaults to the context's growth, the
    attention factor to 0.1 ln(factor) + 1 (or the ratio of mscale and mscale_all_dim's)."""
    original = int(raw.get("original_max_position_embeddings") or cfg["max_position_embeddings"])
    factor = raw.get("factor")
    factor = float(factor) if factor is not None else int(cfg["max_position_embeddings"]) / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = raw.get("attention_factor")
    if attention is None:
        m, m_all = raw.get("mscale"), raw.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return RopeScaling(
        "yarn",
        factor,
        original_max_position_embeddings=original,
        attention_factor=float(attention),
        beta_fast=float(raw.get("beta_fast") or 32),
        beta_slow=float(raw.get("beta_slow") or 1),
        truncate=bool(raw.get("truncate", True)),
    )


def _longrope(raw: dict, cfg: dict) -> RopeScaling:
    """transformers' _compute_longrope_parameters: the factor defaults to the context's growth,
    the attention factor to sqrt(1 + ln(factor) / ln(original context))."""
    original = int(
        cfg.get("original_max_position_embeddings")
        or raw.get("original_max_position_embeddings")
        or cfg["max_position_embeddings"]
    )
    factor = raw.get("factor")
    factor = float(factor) if factor is not None else int(cfg["max_position_embeddings"]) / original
    attention = raw.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    try:
        short = tuple(float(x) for x in raw["short_factor"])
        long = tuple(float(x) for x in raw["long_factor"])
    except (KeyError, TypeError, ValueError):
        raise UnsupportedModelError("longrope rope_scaling needs short_factor and long_factor lists") from None
    return RopeScaling(
        "longrope",
        factor,
        original_max_position_embeddings=original,
        short_factor=short,
        long_factor=long,
        attention_factor=float(attention),
    )
