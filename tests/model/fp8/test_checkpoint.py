"""FP8 checkpoint tensors through a loader's take(name): dequantized for the CPU, per-channel
FP8 weights (fused where projections share an input) for the GPU's Fp8Linear."""

from __future__ import annotations

import pytest
import torch

from tests.support.fp8 import decode_e4m3, dequantize_blocks_by_loop
from traceless.errors import ModelLoadError
from traceless.model.fp8.checkpoint import dequantizing_take, fuse_fp8_weights, read_fp8_weight
from traceless.model.fp8.config import parse_fp8_config
from traceless.model.fp8.convert import FP8

STATIC = parse_fp8_config({"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]})
BLOCK = parse_fp8_config({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})


def _taker(tensors: dict):
    """A loader's take: the named tensor, consumed, or None."""
    return lambda name: tensors.pop(name, None)


def _fp8(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 20).to(FP8)


def _static_checkpoint():
    p = "model.layers.0.self_attn."
    return {
        p + "q_proj.weight": _fp8((64, 32), 0),
        p + "q_proj.weight_scale": torch.tensor(0.5),
        p + "q_proj.input_scale": torch.tensor(0.02),
        p + "k_proj.weight": _fp8((32, 32), 1),
        p + "k_proj.weight_scale": torch.tensor(0.25),
        p + "k_proj.input_scale": torch.tensor(0.03),
        "model.norm.weight": torch.ones(32),
        "lm_head.weight": torch.randn(100, 32).bfloat16(),
    }


def test_the_cpu_path_reads_dequantized_weights_and_consumes_the_scales():
    tensors = _static_checkpoint()
    q_bytes = tensors["model.layers.0.self_attn.q_proj.weight"]
    take = dequantizing_take(_taker(tensors), STATIC, torch.bfloat16)
    q = take("model.layers.0.self_attn.q_proj.weight")
    assert q.dtype == torch.bfloat16 and torch.equal(q, (decode_e4m3(q_bytes) * 0.5).bfloat16())
    assert take("model.layers.0.self_attn.k_proj.weight").dtype == torch.bfloat16
    assert take("lm_head.weight").dtype == torch.bfloat16 and take("model.norm.weight") is not None
    assert tensors == {}  # scales and input scales consumed with their weights


def test_block_wise_weights_dequantized_on_the_cpu_path():
    w = _fp8((256, 200), 2)
    s = torch.rand(2, 2) + 0.1
    take = dequantizing_take(_taker({"m.weight": w, "m.weight_scale_inv": s}), BLOCK, torch.float32)
    assert torch.equal(take("m.weight"), dequantize_blocks_by_loop(w, s, 128, 128).float())


def test_inconsistent_checkpoints_are_refused_naming_the_tensor():
    tensors = _static_checkpoint()
    del tensors["model.layers.0.self_attn.q_proj.weight_scale"]
    with pytest.raises(ModelLoadError, match="q_proj.weight_scale"):
        dequantizing_take(_taker(tensors), STATIC, torch.bfloat16)("model.layers.0.self_attn.q_proj.weight")
    tensors = _static_checkpoint()
    del tensors["model.layers.0.self_attn.k_proj.input_scale"]
    with pytest.raises(ModelLoadError, match="expected an input_scale"):
        read_fp8_weight(_taker(tensors), "model.layers.0.self_attn.k_proj", STATIC)
    tensors = {"lm_head.weight": _fp8((16, 16), 3), "lm_head.weight_scale": torch.tensor(1.0)}
    with pytest.raises(ModelLoadError, match="leaves its module unquantized"):
        dequantizing_take(_taker(tensors), STATIC, torch.bfloat16)("lm_head.weight")


def test_the_gpu_path_fuses_projections_with_per_row_scales():
    tensors = _static_checkpoint()
    p = "model.layers.0.self_attn."
    qb, kb = tensors[p + "q_proj.weight"], tensors[p + "k_proj.weight"]
    take = _taker(tensors)
    fused = fuse_fp8_weights([read_fp8_weight(take, p + n, STATIC) for n in ("q_proj", "k_proj")])
    assert fused.weight.shape == (96, 32) and fused.scale.shape == (96,)
    assert torch.equal(fused.weight.view(torch.uint8), torch.cat([qb, kb]).view(torch.uint8))  # no requantization
    assert torch.equal(fused.scale, torch.cat([torch.full((64,), 0.5), torch.full((32,), 0.25)]))
    assert float(fused.input_scale) == pytest.approx(0.03)  # the larger one covers both


def test_the_gpu_path_requantizes_block_wise_weights_per_row():
    w = _fp8((256, 128), 4)
    s = torch.rand(2, 1) + 0.1
    got = read_fp8_weight(_taker({"m.weight": w, "m.weight_scale_inv": s}), "m", BLOCK)
    exact = dequantize_blocks_by_loop(w, s, 128, 128)
    back = decode_e4m3(got.weight) * got.scale.double()[:, None]
    assert got.input_scale is None
    assert float((back - exact).abs().max() / exact.abs().max()) < 2**-4
