"""MoE hyper-parameters and expert tensors read from Hugging Face checkpoints: tiny transformers
models saved with save_pretrained (the hub's tensor layout) give MoE blocks equal to the models'
own; the bench/models configs give the published expert counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from traceless.errors import ModelLoadError, UnsupportedModelError
from traceless.model.layers.moe import ClampedSwiGLU, GroupedMoE, deinterleave_gate_up
from traceless.model.moe_checkpoint import MoEFamily, moe_spec, read_moe_weights

MODELS = Path(__file__).resolve().parents[2] / "bench" / "models"
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 64,
    "num_experts_per_tok": 2,
}


def _tiny(family: str):
    import transformers as tf

    if family == "mixtral":
        return tf.MixtralForCausalLM(tf.MixtralConfig(intermediate_size=24, num_local_experts=4, **TINY))
    if family == "qwen3_moe":  # layer 1 stays dense (mlp_only_layers)
        return tf.Qwen3MoeForCausalLM(
            tf.Qwen3MoeConfig(
                moe_intermediate_size=24,
                intermediate_size=40,
                num_experts=4,
                head_dim=8,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[1],
                **TINY,
            )
        )
    return tf.GptOssForCausalLM(
        tf.GptOssConfig(intermediate_size=24, num_local_experts=4, head_dim=8, swiglu_limit=1.0, **TINY)
    )


def _scale_up(model) -> None:
    """Peaked routers and unit-scale experts (transformers initializes them small)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mlp." in name:
                big = 4.0 if ("router" in name or name.endswith("mlp.gate.weight")) else 1.0
                p.copy_(torch.randn(p.shape, generator=g) * big / p.shape[-1] ** 0.5)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_saved_checkpoints_give_the_models_own_moe_blocks(family, tmp_path):
    model = _tiny(family).float().eval()
    _scale_up(model)
    model.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    tensors = load_file(tmp_path / "model.safetensors")
    spec = moe_spec(raw)
    assert spec is not None
    h = torch.randn(9, 32, generator=torch.Generator().manual_seed(1))
    sparse = [i for i in range(3) if spec.sparse(i)]
    assert sparse == ([0, 2] if family == "qwen3_moe" else [0, 1, 2])
    for i in sparse:
        weights = read_moe_weights(lambda n: tensors.pop(n, None), f"model.layers.{i}.", spec, torch.float32)
        with torch.no_grad():
            want = model.model.layers[i].mlp(h[None])
        want = (want[0] if isinstance(want, tuple) else want)[0]
        got = GroupedMoE(spec.config, weights)(h)
        assert float((got - want).norm() / want.norm()) < 2e-6
    assert not [k for k in tensors if "expert" in k or "router" in k or "block_sparse_moe" in k]  # all consumed


def test_gpt_oss_mxfp4_experts_are_dequantized_into_the_block_layout():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    raw = json.loads((MODELS / "gpt-oss-20b" / "config.json").read_text())
    spec = moe_spec({**raw, "hidden_size": 64, "intermediate_size": 32, "num_local_experts": 4})
    g = torch.Generator().manual_seed(2)
    p = "model.layers.0.mlp."
    packed = {}
    for name, rows, cols in (("gate_up_proj", 64, 64), ("down_proj", 64, 32)):
        packed[name] = (
            torch.randint(0, 256, (4, rows, cols // 32, 16), dtype=torch.uint8, generator=g),
            torch.randint(120, 130, (4, rows, cols // 32), dtype=torch.uint8, generator=g),
        )
    tensors = {
        p + "router.weight": torch.randn(4, 64),
        p + "router.bias": torch.randn(4),
        p + "experts.gate_up_proj_bias": torch.randn(4, 64),
        p + "experts.down_proj_bias": torch.randn(4, 64),
    }
    for name, (blocks, scales) in packed.items():
        tensors[p + f"experts.{name}_blocks"], tensors[p + f"experts.{name}_scales"] = blocks, scales
    w = read_moe_weights(tensors.get, "model.layers.0.", spec, torch.bfloat16)
    hf_gate_up = convert_moe_packed_tensors(*packed["gate_up_proj"])  # [E, H, 2I] interleaved, x @ W
    assert torch.equal(w.gate_up, deinterleave_gate_up(hf_gate_up.transpose(1, 2)))
    assert torch.equal(w.down, convert_moe_packed_tensors(*packed["down_proj"]).transpose(1, 2))


@pytest.mark.parametrize(
    ("name", "family", "experts", "top_k", "inter", "renormalize"),
    [
        ("mixtral-8x7b", MoEFamily.MIXTRAL, 8, 2, 14336, True),
        ("qwen3-30b-a3b", MoEFamily.QWEN3_MOE, 128, 8, 768, True),
        ("gpt-oss-20b", MoEFamily.GPT_OSS, 32, 4, 2880, False),
    ],
)
def test_bench_configs_give_the_published_experts(name, family, experts, top_k, inter, renormalize):
    spec = moe_spec(json.loads((MODELS / name / "config.json").read_text()))
    assert spec is not None and spec.family is family
    r = spec.config.router
    got = (r.num_experts, r.top_k, spec.config.intermediate_size, r.renormalize)
    assert got == (experts, top_k, inter, renormalize)
    assert spec.dense_layers == frozenset()
    if family is MoEFamily.GPT_OSS:
        assert spec.config.activation == ClampedSwiGLU(alpha=1.702, limit=7.0) and spec.config.expert_bias
    assert moe_spec(json.loads((MODELS / "llama-3.1-70b" / "config.json").read_text())) is None


@pytest.mark.parametrize(
    ("change", "error", "named"),
    [
        ({"hidden_act": "gelu"}, UnsupportedModelError, "hidden_act"),
        ({"experts_per_token": 2}, ModelLoadError, "experts_per_token"),
        ({"num_local_experts": None}, ModelLoadError, "num_local_experts"),
        ({"swiglu_limit": "7"}, ModelLoadError, "swiglu_limit"),
    ],
)
def test_malformed_moe_configs_are_refused_naming_the_field(change, error, named):
    raw = {**json.loads((MODELS / "gpt-oss-20b" / "config.json").read_text()), **change}
    with pytest.raises(error, match=named):
        moe_spec(raw)


def test_missing_expert_tensors_are_named():
    spec = moe_spec(json.loads((MODELS / "mixtral-8x7b" / "config.json").read_text()))
    with pytest.raises(ModelLoadError, match="block_sparse_moe.experts.0.w1.weight"):
        read_moe_weights({}.get, "model.layers.0.", spec, torch.bfloat16)


def test_qwen3_sparse_step_and_mlp_only_layers_pick_the_dense_layers():
    raw = {
        **json.loads((MODELS / "qwen3-30b-a3b" / "config.json").read_text()),
        "num_hidden_layers": 6,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    spec = moe_spec(raw)
    assert spec is not None and [i for i in range(6) if spec.sparse(i)] == [1, 5]  # as Qwen3MoeDecoderLayer
