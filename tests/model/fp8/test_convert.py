"""FP8 dequantization against references written from the format's definition, and quantization
(per channel, per token, static) within the e4m3 rounding bound."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.fp8 import decode_e4m3, dequantize_blocks_by_loop, e4m3_value
from traceless.errors import ModelLoadError
from traceless.model.fp8 import convert
from traceless.model.fp8.config import ActivationScheme, Fp8Config, Fp8Method, WeightScales

BLOCK = Fp8Config(Fp8Method.FP8, WeightScales.BLOCK, ActivationScheme.DYNAMIC, block=(128, 128))
TENSOR = Fp8Config(Fp8Method.FP8, WeightScales.TENSOR, ActivationScheme.STATIC)
CHANNEL = Fp8Config(Fp8Method.COMPRESSED_TENSORS, WeightScales.CHANNEL, ActivationScheme.DYNAMIC)


def _random_fp8(shape, seed: int) -> torch.Tensor:
    """Every finite e4m3 byte pattern is as likely (NaN bytes excluded)."""
    b = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    b[(b & 0x7F) == 0x7F] = 0x3F
    return b.view(convert.FP8)


def test_torch_reads_every_e4m3_byte_as_the_definition_says():
    q = torch.arange(256, dtype=torch.uint8).view(convert.FP8)
    got, want = q.double(), decode_e4m3(q)
    nan = want.isnan()
    assert bool((got.isnan() == nan).all()) and int(nan.sum()) == 2
    assert torch.equal(got[~nan], want[~nan])
    assert e4m3_value(0x7E) == convert.FP8_MAX == 448.0


def test_per_tensor_dequantization():
    q = _random_fp8((48, 80), 0)
    scale = torch.tensor(0.0123)
    got = convert.dequantize(q, scale, TENSOR, torch.float32)
    assert torch.equal(got, (decode_e4m3(q) * scale.double()).float())  # one rounding, as in float32


def test_per_channel_dequantization_to_bfloat16():
    q = _random_fp8((48, 80), 1)
    scale = torch.rand(48, 1, generator=torch.Generator().manual_seed(1)) + 0.01  # compressed-tensors: [N, 1]
    got = convert.dequantize(q, scale, CHANNEL, torch.bfloat16)
    want = (decode_e4m3(q) * scale.double()).bfloat16()
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)


@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (130, 129)])  # partial last tiles too
def test_block_wise_dequantization(shape):
    q = _random_fp8(shape, 2)
    grid = (math.ceil(shape[0] / 128), math.ceil(shape[1] / 128))
    scale_inv = torch.rand(grid, generator=torch.Generator().manual_seed(2)) * 1e-3 + 1e-5
    got = convert.dequantize(q, scale_inv, BLOCK, torch.float32)
    want = dequantize_blocks_by_loop(q, scale_inv, 128, 128).float()
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("config", "scale", "named"),
    [
        (BLOCK, torch.ones(2, 3), "block weight scale of shape"),
        (TENSOR, torch.ones(2), "tensor weight scale"),
        (CHANNEL, torch.ones(47), "channel weight scale"),
    ],
)
def test_scales_of_the_wrong_shape_are_refused(config, scale, named):
    with pytest.raises(ModelLoadError, match=named):
        convert.dequantize(_random_fp8((48, 80), 3), scale, config, torch.float32)
    with pytest.raises(ModelLoadError, match="expected float8_e4m3fn"):
        convert.dequantize(torch.zeros(48, 80), scale, config, torch.float32)


def _within_rounding(approx: torch.Tensor, exact: torch.Tensor, scale: torch.Tensor) -> bool:
    """e4m3 keeps 3 mantissa bits: rounding moves a normal value by at most 2^-4 of itself, a
    subnormal one by at most half the smallest step (2^-10 of the scale)."""
    bound = torch.maximum(exact.abs() * 2.0**-4, scale * 2.0**-10) * (1 + 1e-6)
    return bool(((approx - exact).abs() <= bound).all())


def test_per_channel_quantization_of_a_bfloat16_weight():
    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(4)) * torch.logspace(-3, 1, 64)[:, None]
    w[5] = 0.0  # a row of zeros: a positive scale, zeros back
    w = w.bfloat16()
    q, scale = convert.quantize_per_channel(w)
    assert q.dtype == convert.FP8 and scale.shape == (64,) and bool((scale > 0).all())
    back = decode_e4m3(q) * scale.double()[:, None]
    assert _within_rounding(back, w.double(), scale.double()[:, None])
    torch.testing.assert_close(back.abs().amax(1), w.double().abs().amax(1), rtol=1e-6, atol=0)  # row max exact
    assert torch.equal(back[5], torch.zeros(96, dtype=torch.float64))


def test_block_wise_weights_requantized_per_channel_stay_within_one_rounding():
    q = _random_fp8((256, 256), 5)
    scale_inv = torch.rand(2, 2, generator=torch.Generator().manual_seed(5)) * 1e-3 + 1e-4
    exact = dequantize_blocks_by_loop(q, scale_inv, 128, 128)
    q2, scale = convert.requantize_blocks(q, scale_inv, (128, 128))
    assert _within_rounding(decode_e4m3(q2) * scale.double()[:, None], exact, scale.double()[:, None])


def test_per_token_activation_scales_are_row_maxima_over_448():
    x = torch.randn(9, 40, generator=torch.Generator().manual_seed(6)) * 3
    q, scale = convert.quantize_per_token(x)
    torch.testing.assert_close(scale[:, 0], x.abs().amax(1) / 448.0, rtol=1e-6, atol=0)
    assert _within_rounding(decode_e4m3(q) * scale.double(), x.double(), scale.double())
    q1, s1 = convert.quantize_per_token(x[3:4])  # a token alone: the same bytes and scale
    assert torch.equal(q1.view(torch.uint8), q[3:4].view(torch.uint8)) and torch.equal(s1, scale[3:4])


def test_static_activation_quantization_saturates_beyond_its_range():
    x = torch.tensor([[1.0, -2.0, 1e4, -1e4]])
    q = convert.quantize_static(x, torch.tensor([0.5]))
    assert decode_e4m3(q).tolist() == [[2.0, -4.0, 448.0, -448.0]]
