"""Reference for the quantized matmul kernels: dequantize, then multiply in float64."""

from __future__ import annotations

import torch

from traceless.model.layers.quant import QuantTensor


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """The kernels' activation rounding, in float32: per block of 32, d = max|x| / 127,
    q = round-half-even(x * (1 / d)); returns d * q (what the integer dot products see)."""
    b = x.float().reshape(x.shape[0], -1, 32)
    d = b.abs().amax(dim=2, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.round(b * inv).clamp(-127, 127)
    return (q * d).reshape(x.shape)


def reference_matmul(x: torch.Tensor, w: QuantTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dequantized W times the quantized activations, |W| times |those activations|): the second is
    the scale a float error of the sum is measured against. Both float64 [T, N]."""
    deq = w.dequantize().double()
    xq = quantize_activations(x).double()
    return xq @ deq.T, xq.abs() @ deq.abs().T
