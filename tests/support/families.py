"""Tiny random models of the families beyond Llama (Qwen3, Phi-3 with LongRoPE, Gemma 2/3,
Mistral with a sliding window, the mixtures of experts Mixtral, Qwen3-MoE and gpt-oss), written as Hugging
Face directories from a transformers config, and the greedy-parity helpers the family tests share."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.conftest import TINY_VOCAB, _write_tokenizer

COMMON = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)


def longrope_scaling(rotary_dims: int, original: int) -> dict:
    """LongRoPE factors that differ between short and long and across frequencies."""
    half = rotary_dims // 2
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.1 * i for i in range(half)],
        "long_factor": [2.0 + 0.5 * i for i in range(half)],
        "original_max_position_embeddings": original,
    }


def _build(kind: str, overrides: dict):
    import transformers as tf

    cfg = COMMON | overrides
    if kind == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**({"head_dim": 24} | cfg)))
    if kind == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(**cfg))
    if kind == "phi3":
        return tf.Phi3ForCausalLM(tf.Phi3Config(**cfg))
    if kind == "gemma2":
        return tf.Gemma2ForCausalLM(tf.Gemma2Config(**({"head_dim": 16, "query_pre_attn_scalar": 24} | cfg)))
    if kind == "gemma3":
        return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**({"head_dim": 16, "query_pre_attn_scalar": 24} | cfg)))
    if kind == "mixtral":  # experts of half the dense width: 4 of them, top 2
        return tf.MixtralForCausalLM(
            tf.MixtralConfig(
                **(COMMON | {"intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2} | overrides)
            )
        )
    if kind == "qwen3_moe":
        return tf.Qwen3MoeForCausalLM(
            tf.Qwen3MoeConfig(
                **(
                    {
                        "head_dim": 24,
                        "num_experts": 8,
                        "num_experts_per_tok": 2,
                        "moe_intermediate_size": 48,
                        "norm_topk_prob": True,
                    }
                    | cfg
                )
            )
        )
    if kind == "gpt_oss":  # alternating windowed and full layers, attention sinks, clamped SwiGLU experts
        types = ["sliding_attention", "full_attention"] * 2
        return tf.GptOssForCausalLM(
            tf.GptOssConfig(**(COMMON | GPT_OSS | {"layer_types": types[: cfg_layers(overrides)]} | overrides))
        )
    raise ValueError(kind)


GPT_OSS = dict(
    num_hidden_layers=4,
    head_dim=16,
    intermediate_size=64,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=8,
    attention_bias=True,
    swiglu_limit=7.0,
    rope_scaling={
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
    },
)


def cfg_layers(overrides: dict) -> int:
    return int(overrides.get("num_hidden_layers", GPT_OSS["num_hidden_layers"]))


_ROUTERS = ("mlp.gate.weight", "mlp.router.weight")


def _peak(model, kind: str) -> None:
    """Weights large enough that greedy choices are not near-ties (as conftest's make_tiny_model)."""
    gemma = kind.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:  # matrices, and experts stacked [E, out, in]
                # the output head 8x more: logits of ~+-20, so greedy picks are far apart; the
                # routers 4x more, so that top-k choices are far from ties too
                p.mul_(32.0 if name == "lm_head.weight" else 16.0 if name.endswith(_ROUTERS) else 4.0)
            elif name.endswith("bias"):
                # gpt-oss: biases on every projection and expert; large ones would add the same
                # vector to every token's residual and drown what the tokens say
                p.normal_(0.0, 0.02 if kind == "gpt_oss" else 0.5)
            elif gemma:
                p.uniform_(-0.5, 0.5)  # applied as 1 + w
            else:
                p.uniform_(0.5, 1.5)


def make_family_model(path: Path, kind: str, seed: int = 0, **overrides) -> Path:
    torch.manual_seed(seed)
    model = _build(kind, overrides)
    _peak(model, kind)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    _write_tokenizer(path, TINY_VOCAB)
    return path


def as_multimodal_gemma3(text_dir: Path, path: Path) -> Path:
    """A Gemma3ForConditionalGeneration-shaped directory holding the text model of `text_dir`
    (tensors under model.language_model., the config under text_config) plus a vision tensor."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(text_dir / "model.safetensors"))
    renamed = {
        ("model.language_model." + k[len("model.") :]) if k.startswith("model.") else k: v for k, v in tensors.items()
    }
    renamed["model.vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.ones(4, 3, 2, 2)
    path.mkdir(parents=True, exist_ok=True)
    half = len(renamed) // 2
    names = sorted(renamed)
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: renamed[k].contiguous() for k in keys}, str(path / file))
        weight_map |= {k: file for k in keys}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    text = json.loads((text_dir / "config.json").read_text())
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text}
    (path / "config.json").write_text(json.dumps(config))
    _write_tokenizer(path, TINY_VOCAB)
    return path


def hf_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """Reference: transformers' own greedy decoding, one prompt at a time (no padding)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    return out[0, len(prompt_ids) :].tolist()


def ours(llm, prompts: list[list[int]], n: int, batched: bool) -> list[list[int]]:
    from traceless import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    if batched:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    else:
        outs = [llm.generate({"prompt_token_ids": p}, params, use_tqdm=False)[0] for p in prompts]
    return [list(o.outputs[0].token_ids) for o in outs]


def hf_model(path):
    """transformers' float32 model of a checkpoint directory, in eval mode (the reference)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


# The family models the parity tests build: (model_type, config overrides), with the lengths that
# straddle their sliding window (WINDOW) and LongRoPE's original context (ORIGINAL).
WINDOW = 12
ORIGINAL = 32  # LongRoPE's original context
FAMILIES = {
    "qwen3": ("qwen3", {}),
    "qwen3-tied": ("qwen3", {"tie_word_embeddings": True}),
    "phi3-longrope": (
        "phi3",
        {"rope_scaling": longrope_scaling(16, ORIGINAL), "original_max_position_embeddings": ORIGINAL},
    ),
    "phi3-partial": (
        "phi3",
        {
            "partial_rotary_factor": 0.5,
            "rope_scaling": longrope_scaling(8, ORIGINAL),
            "original_max_position_embeddings": ORIGINAL,
            "sliding_window": 20,
        },
    ),
    "gemma2": ("gemma2", {"sliding_window": WINDOW, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}),
    "gemma3": (
        "gemma3",
        {
            "sliding_window": WINDOW,
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
    ),
    "mistral-window": ("mistral", {"sliding_window": WINDOW}),
}
# lengths around the window (12) and LongRoPE's original context (32); 20 new tokens each
LENGTHS = (1, 5, 12, 13, 30, 45)
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
