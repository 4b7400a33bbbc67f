"""GGML block formats: their layouts and a vectorized dequantizer (torch, whole tensors at once).

A quantized GGUF tensor of shape [rows, cols] is rows * cols / block_size blocks of `type_size`
bytes, each coding `block_size` consecutive values of one row. The float arithmetic below follows
llama.cpp's reference dequantizers step by step (same products, same order, float32), so the
values equal the `gguf` package's `gguf.quants.dequantize` to the bit.

    Q8_0  [d f16][32 x int8]                           w = d * q
    Q4_0  [d f16][16 bytes: q_j | q_(j+16) << 4]       w = d * (q - 8)
    Q4_1  [d f16][m f16][16 bytes as Q4_0]             w = d * q + m
    Q2_K  [16 scales: sc | m << 4][64 qs][d][dmin]     w = (d * sc) * q - dmin * m          (groups of 16)
    Q3_K  [32 hmask][64 qs][12 scales][d]              w = (d * (sc - 32)) * (q - 4 * !h)    (groups of 16)
    Q4_K  [d][dmin][12 scales][128 qs]                 w = (d * sc) * q - dmin * m          (groups of 32)
    Q5_K  [d][dmin][12 scales][32 qh][128 qs]          as Q4_K with a fifth bit from qh
    Q6_K  [128 ql][64 qh][16 int8 scales][d]           w = (d * sc) * (q - 32)              (groups of 16)
K-quant super-blocks hold 256 values; their 6-bit scales and mins are packed as `_scale_min_k4`
unpacks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QK_K = 256


@dataclass(frozen=True, slots=True)
class BlockFormat:
    name: str
    block_size: int  # values per block
    type_size: int  # bytes per block


FORMATS = {
    f.name: f
    for f in (
        BlockFormat("Q4_0", 32, 18),
        BlockFormat("Q4_1", 32, 20),
        BlockFormat("Q8_0", 32, 34),
        BlockFormat("Q2_K", QK_K, 84),
        BlockFormat("Q3_K", QK_K, 110),
        BlockFormat("Q4_K", QK_K, 144),
        BlockFormat("Q5_K", QK_K, 176),
        BlockFormat("Q6_K", QK_K, 210),
    )
}


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] bytes -> [n, 1] float32 from little-endian float16."""
    return b.contiguous().view(torch.float16).float()


def _bits(b: torch.Tensor, shifts: tuple[int, ...], mask: int) -> torch.Tensor:
    """b [..., n] uint8 -> [..., len(shifts), n]: (b >> s) & mask for each shift s."""
    s = torch.tensor(shifts, dtype=torch.uint8).view(-1, 1)
    return (b.unsqueeze(-2) >> s) & mask


def _q8_0(blk: torch.Tensor) -> torch.Tensor:
    return blk[:, 2:].contiguous().view(torch.int8).float() * _f16(blk[:, :2])


def _q4_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 16] -> [n, 32]: element j is the low nibble of byte j, element j + 16 the high one."""
    return _bits(qs, (0, 4), 0x0F).reshape(qs.shape[0], 32)


def _q4_0(blk: torch.Tensor) -> torch.Tensor:
    q = (_q4_nibbles(blk[:, 2:]).view(torch.int8) - 8).float()
    return _f16(blk[:, :2]) * q


def _q4_1(blk: torch.Tensor) -> torch.Tensor:
    return _f16(blk[:, :2]) * _q4_nibbles(blk[:, 4:]).float() + _f16(blk[:, 2:4])


def _q2_k(blk: torch.Tensor) -> torch.Tensor:
    n = blk.shape[0]
    scales, qs = blk[:, :16], blk[:, 16:80]
    d, dmin = _f16(blk[:, 80:82]), _f16(blk[:, 82:84])
    dl = (d * (scales & 0xF).float()).view(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).view(n, 16, 1)
    # qs [n, 2 halves, 32]: value (half h, shift s, byte i) is element h*128 + s*32 + i
    q = _bits(qs.reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 16, 16).float()
    return (dl * q - ml).view(n, QK_K)


def _q3_k(blk: torch.Tensor) -> torch.Tensor:
    n = blk.shape[0]
    hmask, qs, packed, d = blk[:, :32], blk[:, 32:96], blk[:, 96:108], _f16(blk[:, 108:110])
    lo = _bits(packed[:, :8], (0, 4), 0x0F).reshape(n, 16)
    hi = _bits(packed[:, 8:12], (0, 2, 4, 6), 0x03).reshape(n, 16)
    sc = ((lo | (hi << 4)).view(torch.int8) - 32).float()
    dl = (d * sc).view(n, 16, 1)
    ql = _bits(qs.reshape(n, 2, 32), (0, 2, 4, 6), 3).reshape(n, 16, 16)
    qh = _bits(hmask.reshape(n, 1, 32), tuple(range(8)), 1).reshape(n, 16, 16) ^ 1  # offset 4 where the bit is 0
    q = (ql.view(torch.int8) - (qh << 2).view(torch.int8)).float()
    return (dl * q).view(n, QK_K)


def _scale_min_k4(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, 12] -> 8 six-bit scales and 8 six-bit mins [n, 8] each:
    bytes 0-3:  scale j (6 low bits), top 2 bits = high bits of scale j+4
    bytes 4-7:  min j   (6 low bits), top 2 bits = high bits of min j+4
    bytes 8-11: low nibble = scale j+4 low bits, high nibble = min j+4 low bits"""
    n = packed.shape[0]
    d, m, md = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.view(n, 8), mn.view(n, 8)


def _k_scales(blk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K head -> per-32 scale d*sc and offset dmin*m, [n, 8, 1] each."""
    n = blk.shape[0]
    sc, mn = _scale_min_k4(blk[:, 4:16])
    d = (_f16(blk[:, 0:2]) * sc.float()).view(n, 8, 1)
    dm = (_f16(blk[:, 2:4]) * mn.float()).view(n, 8, 1)
    return d, dm


def _q4_k(blk: torch.Tensor) -> torch.Tensor:
    n = blk.shape[0]
    d, dm = _k_scales(blk)
    # qs [n, 4 chunks, 32]: chunk c low nibbles are values 64c..64c+31, high nibbles 64c+32..
    q = _bits(blk[:, 16:].reshape(n, 4, 32), (0, 4), 0x0F).reshape(n, 8, 32).float()
    return (d * q - dm).view(n, QK_K)


def _q5_k(blk: torch.Tensor) -> torch.Tensor:
    n = blk.shape[0]
    d, dm = _k_scales(blk)
    ql = _bits(blk[:, 48:].reshape(n, 4, 32), (0, 4), 0x0F).reshape(n, 8, 32)
    qh = _bits(blk[:, 16:48].reshape(n, 1, 32), tuple(range(8)), 1).reshape(n, 8, 32)
    q = (ql | (qh << 4)).float()
    return (d * q - dm).view(n, QK_K)


def _q6_k(blk: torch.Tensor) -> torch.Tensor:
    n = blk.shape[0]
    ql, qh, scales, d = blk[:, :128], blk[:, 128:192], blk[:, 192:208], _f16(blk[:, 208:210])
    dl = (d * scales.contiguous().view(torch.int8).float()).view(n, 16, 1)
    lo = _bits(ql.reshape(n, 2, 64), (0, 4), 0x0F).reshape(n, 8, 32)
    hi = _bits(qh.reshape(n, 2, 32), (0, 2, 4, 6), 0x03).reshape(n, 8, 32)
    q = ((lo | (hi << 4)).view(torch.int8) - 32).view(n, 16, 16).float()
    return (dl * q).view(n, QK_K)


_DEQUANT = {
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}


def dequantize(raw: torch.Tensor, fmt: str, shape: tuple[int, int]) -> torch.Tensor:
    """raw: the tensor's bytes (uint8, any shape, rows * cols / block_size * type_size of them)
    -> float32 [rows, cols]. Raises ValueError when the byte count does not fit the shape."""
    f = FORMATS[fmt]
    rows, cols = shape
    if cols % f.block_size or raw.numel() != rows * cols // f.block_size * f.type_size:
        raise ValueError(f"{raw.numel()} bytes do not hold a {fmt} tensor of shape {shape}")
    blocks = raw.reshape(-1, f.type_size)
    return _DEQUANT[fmt](blocks).reshape(rows, cols)
