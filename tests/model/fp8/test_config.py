"""quantization_config forms of FP8 checkpoints: the published ones parse into Fp8Config; every
other form is refused with an error naming the field."""

from __future__ import annotations

import copy

import pytest

from traceless.errors import UnsupportedModelError
from traceless.model.fp8.config import ActivationScheme, Fp8Method, WeightScales, parse_fp8_config

# As published: a Qwen3 "-FP8" / DeepSeek-V3 block-wise config, an AutoFP8 per-tensor static one,
# and llm-compressor's FP8_DYNAMIC (per-channel weights, per-token activations) and FP8 (static).
QWEN3_FP8 = {
    "activation_scheme": "dynamic",
    "modules_to_not_convert": ["lm_head"],
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}
AUTOFP8_STATIC = {"activation_scheme": "static", "ignored_layers": ["lm_head"], "quant_method": "fp8"}


def _ct(weights_strategy: str, dynamic: bool) -> dict:
    return {
        "config_groups": {
            "group_0": {
                "input_activations": {
                    "actorder": None,
                    "block_structure": None,
                    "dynamic": dynamic,
                    "group_size": None,
                    "num_bits": 8,
                    "observer": None if dynamic else "minmax",
                    "observer_kwargs": {},
                    "strategy": "token" if dynamic else "tensor",
                    "symmetric": True,
                    "type": "float",
                },
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {
                    "actorder": None,
                    "block_structure": None,
                    "dynamic": False,
                    "group_size": None,
                    "num_bits": 8,
                    "observer": "minmax",
                    "observer_kwargs": {},
                    "strategy": weights_strategy,
                    "symmetric": True,
                    "type": "float",
                },
            }
        },
        "format": "float-quantized",
        "global_compression_ratio": 1.24,
        "ignore": ["lm_head", "re:.*mlp.gate$"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }


def test_block_wise_fp8_config():
    c = parse_fp8_config(QWEN3_FP8)
    assert (c.method, c.weight_scales, c.activations, c.block) == (
        Fp8Method.FP8,
        WeightScales.BLOCK,
        ActivationScheme.DYNAMIC,
        (128, 128),
    )
    assert c.weight_scale_name == "weight_scale_inv"
    assert not c.quantizes("lm_head") and c.quantizes("model.layers.0.self_attn.q_proj")


def test_per_tensor_static_fp8_config():
    c = parse_fp8_config(AUTOFP8_STATIC)
    assert (c.weight_scales, c.activations, c.block, c.weight_scale_name) == (
        WeightScales.TENSOR,
        ActivationScheme.STATIC,
        None,
        "weight_scale",
    )


@pytest.mark.parametrize(("strategy", "dynamic"), [("channel", True), ("tensor", False), ("channel", False)])
def test_compressed_tensors_float8_configs(strategy, dynamic):
    c = parse_fp8_config(_ct(strategy, dynamic))
    assert c.method is Fp8Method.COMPRESSED_TENSORS
    assert c.weight_scales is WeightScales(strategy)
    assert c.activations is (ActivationScheme.DYNAMIC if dynamic else ActivationScheme.STATIC)
    assert not c.quantizes("lm_head")
    assert not c.quantizes("model.layers.3.mlp.gate")  # a router, by the "re:" entry
    assert c.quantizes("model.layers.3.mlp.gate_proj") and c.quantizes("model.layers.3.mlp.experts.0.gate_proj")


def _set(raw: dict, path: str, value) -> dict:
    raw = copy.deepcopy(raw)
    *parents, last = path.split(".")
    node = raw
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return raw


_DELETE = object()
G = "config_groups.group_0"


@pytest.mark.parametrize(
    ("base", "path", "value", "named"),
    [
        (QWEN3_FP8, "quant_method", "awq", "quant_method"),
        (QWEN3_FP8, "fmt", "e5m2", "fmt"),
        (QWEN3_FP8, "activation_scheme", "static", "activation_scheme"),
        (QWEN3_FP8, "weight_block_size", [128], "weight_block_size"),
        (QWEN3_FP8, "scale_fmt", "ue8m0", "scale_fmt"),
        (QWEN3_FP8, "dequantize", True, "dequantize"),
        (QWEN3_FP8, "kv_cache_scheme", "fp8", "kv_cache_scheme"),
        (AUTOFP8_STATIC, "activation_scheme", "per_token", "activation_scheme"),
        (AUTOFP8_STATIC, "ignored_layers", "lm_head", "ignored_layers"),
        (_ct("channel", True), "format", "pack-quantized", "format"),
        (_ct("channel", True), "kv_cache_scheme", {"num_bits": 8}, "kv_cache_scheme"),
        (_ct("channel", True), "sparsity_config", {"format": "sparse-24"}, "sparsity_config"),
        (_ct("channel", True), "surprise", 1, "surprise"),
        (_ct("channel", True), f"{G}.targets", ["re:.*proj"], f"{G}.targets"),
        (_ct("channel", True), f"{G}.output_activations", {"num_bits": 8}, f"{G}.output_activations"),
        (_ct("channel", True), f"{G}.input_activations", None, f"{G}.input_activations"),
        (_ct("channel", True), f"{G}.weights.strategy", "group", f"{G}.weights.strategy"),
        (_ct("channel", True), f"{G}.weights.strategy", "block", f"{G}.weights.strategy"),
        (_ct("channel", True), f"{G}.weights.group_size", 128, f"{G}.weights.group_size"),
        (_ct("channel", True), f"{G}.weights.type", "int", f"{G}.weights.type"),
        (_ct("channel", True), f"{G}.weights.num_bits", 4, f"{G}.weights.type"),
        (_ct("channel", True), f"{G}.weights.symmetric", False, f"{G}.weights.symmetric"),
        (_ct("channel", True), f"{G}.weights.dynamic", True, f"{G}.weights.dynamic"),
        (_ct("channel", True), f"{G}.input_activations.strategy", "tensor", f"{G}.input_activations.strategy"),
        (_ct("tensor", False), f"{G}.input_activations.strategy", "token", f"{G}.input_activations.strategy"),
        (_ct("tensor", False), f"{G}.input_activations.zp_dtype", "int8", "zp_dtype"),
    ],
)
def test_other_forms_are_refused_naming_the_field(base, path, value, named):
    with pytest.raises(UnsupportedModelError, match=named):
        parse_fp8_config(_set(base, path, value))


def test_compressed_tensors_groups_must_agree():
    raw = _ct("channel", True)
    other = copy.deepcopy(raw["config_groups"]["group_0"])
    other["weights"]["strategy"] = "tensor"
    raw["config_groups"]["group_1"] = other
    with pytest.raises(UnsupportedModelError, match="config_groups differ"):
        parse_fp8_config(raw)
    raw["config_groups"]["group_1"] = copy.deepcopy(raw["config_groups"]["group_0"])
    assert parse_fp8_config(raw).weight_scales is WeightScales.CHANNEL
