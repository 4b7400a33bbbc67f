"""FP8 references written from the formats' definitions, independent of torch's float8 casts."""

from __future__ import annotations

import torch


def e4m3_value(byte: int) -> float:
    """The value of an OCP float8 e4m3fn byte: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa
    bits; exponent 0 is subnormal (2^-6 * m / 8); S.1111.111 is NaN; there is no infinity."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    if exp == 15 and man == 7:
        return float("nan")
    if exp == 0:
        return sign * 2.0**-6 * man / 8
    return sign * 2.0 ** (exp - 7) * (1 + man / 8)


def decode_e4m3(q: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn tensor -> float64 through e4m3_value on each byte."""
    table = torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float64)
    return table[q.view(torch.uint8).long()]


def dequantize_blocks_by_loop(q: torch.Tensor, scale: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """Block-wise FP8 by its definition: tile (i, j) of bn x bk elements times scale[i, j]."""
    w = decode_e4m3(q)
    out = torch.empty_like(w)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = (slice(i * bn, (i + 1) * bn), slice(j * bk, (j + 1) * bk))
            out[tile] = w[tile] * float(scale[i, j])
    return out
