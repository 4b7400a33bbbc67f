"""MXFP4 dequantization against transformers' convert_moe_packed_tensors (gpt-oss's loader) and
against the format's definition."""

from __future__ import annotations

import pytest
import torch

from traceless.errors import ModelLoadError
from traceless.model.mxfp4 import dequantize_mxfp4


def _random(E: int, R: int, G: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (E, R, G, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(110, 140, (E, R, G), dtype=torch.uint8, generator=g)  # 2^-17 .. 2^12
    return blocks, scales


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mxfp4_matches_transformers(dtype):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _random(3, 40, 2, 0)
    got = dequantize_mxfp4(blocks, scales, dtype)  # [E, rows, cols]: Linear layout
    want = convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # [E, cols, rows]: x @ W layout
    assert got.shape == (3, 40, 64) and got.dtype == dtype
    assert torch.equal(got, want.transpose(1, 2))


def test_mxfp4_by_the_definition():
    """Byte 0x21: low nibble 1 (+0.5) first, high nibble 2 (+1.0); 0xF9: -0.5 then -6.0. Scale
    byte 129: 2^2."""
    blocks = torch.zeros(1, 1, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0, 0], blocks[0, 0, 0, 1] = 0x21, 0xF9
    out = dequantize_mxfp4(blocks, torch.full((1, 1, 1), 129, dtype=torch.uint8), torch.float32)
    assert out[0, 0, :4].tolist() == [2.0, 4.0, -2.0, -24.0]
    assert out[0, 0, 4:].abs().sum() == 0


def test_mxfp4_refuses_misfit_tensors_and_nan_scales():
    blocks, scales = _random(1, 4, 2, 1)
    with pytest.raises(ModelLoadError, match="do not fit"):
        dequantize_mxfp4(blocks, scales[:, :, :1], torch.bfloat16)
    scales[0, 1, 1] = 255
    with pytest.raises(ModelLoadError, match="NaN"):
        dequantize_mxfp4(blocks, scales, torch.bfloat16)
