"""Linear over quantized weights: one part, stacked parts of mixed formats (dense among them), a
bias, few rows and many (one kernel for all), all against dequantize-then-matmul."""

from __future__ import annotations

import pytest
import torch

from traceless.model.layers.linear import Linear, cat_rows
from traceless.model.layers.quant import QuantTensor, quantize_q4_0, quantize_q8_0, to_kernel_layout


def _dense(w) -> torch.Tensor:
    return w.dequantize() if isinstance(w, QuantTensor) else w


@pytest.mark.parametrize("rows", [1, 5, 35])
def test_stacked_mixed_parts_with_bias(rows):
    torch.manual_seed(rows)
    parts = [
        to_kernel_layout(quantize_q4_0(torch.randn(24, 128))),
        quantize_q8_0(torch.randn(8, 128)),
        torch.randn(8, 128),
    ]
    stacked = cat_rows(parts)
    assert isinstance(stacked, tuple) and len(stacked) == 3
    bias = torch.randn(40)
    x = torch.randn(rows, 128)
    got = Linear(stacked, bias, pack=False)(x)
    want = x.double() @ torch.cat([_dense(p) for p in parts]).double().T + bias.double()
    scale = x.double().abs() @ torch.cat([_dense(p) for p in parts]).double().abs().T + bias.double().abs()
    assert got.dtype == torch.float32 and got.shape == (rows, 40)
    assert torch.all((got.double() - want).abs() <= 0.02 * scale)  # int8 activations


def test_same_format_parts_stack_into_one_tensor():
    a, b = quantize_q8_0(torch.randn(4, 64)), quantize_q8_0(torch.randn(6, 64))
    both = cat_rows([a, b])
    assert isinstance(both, QuantTensor) and both.shape == (10, 64)
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
