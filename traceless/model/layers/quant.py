"""Weights kept quantized in memory (CPU): a matrix stored as GGML blocks, the very bytes of a
GGUF file or blocks made at load from a dense checkpoint, multiplied by the native kernels in
csrc/qmatmul.c without ever being expanded.

    QuantTensor.blocks: uint8 [rows, row_bytes], row r = cols / block_size blocks of row r

Q4_0 and Q4_1 rows with an even number of blocks are held regrouped (`Q4_0_ROWS`, `Q4_1_ROWS`):
the same bytes, row r = [nb x 16 code bytes][nb x f16 d][nb x f16 m (Q4_1)], the code bytes
of each whole group of 16 blocks interleaved: code byte i of block 16g + j at
256g + 64 (i // 4) + 4j + i % 4 (the blocks after the last whole group keep 16 bytes each). The
kernels then read byte quads of 16 blocks in one load, lane j = block j (`to_kernel_layout`; no
value changes). Q8_0 rows (any block count) are held the same way (`Q8_0_ROWS`): row r =
[nb x 32 code bytes][nb x f16 d], code byte i of block 16g + j at 512g + 64 (i // 4) + 4j + i % 4,
each code stored as w + 128 (w ^ 0x80, unsigned for the int8 dot product; ggml_blocks undoes it).

Quantizing at load follows llama.cpp's reference quantizers (ggml-quants.c) step by step, so a
checkpoint quantized here holds the blocks `gguf.quants.quantize` would write.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from traceless.model.layers.ggml_blocks import FORMATS, dequantize


class QFormat(Enum):
    """Block formats the kernels multiply directly (values: their codes in csrc/qmatmul.c)."""

    Q8_0 = 0
    Q4_0 = 1
    Q4_1 = 2
    Q4_K = 3
    Q5_K = 4
    Q6_K = 5
    Q4_0_ROWS = 6
    Q4_1_ROWS = 7
    Q8_0_ROWS = 8


_ROWS_OF = {QFormat.Q4_0: QFormat.Q4_0_ROWS, QFormat.Q4_1: QFormat.Q4_1_ROWS, QFormat.Q8_0: QFormat.Q8_0_ROWS}
_BASE_OF = {v: k for k, v in _ROWS_OF.items()}
_PAIRED = (QFormat.Q4_0_ROWS, QFormat.Q4_1_ROWS)  # rows of an even number of blocks only
_Q8_OFFSET = 0x80  # Q8_0_ROWS codes: w + 128 as a byte


def _block_format(fmt: QFormat) -> tuple[int, int]:
    """(values, bytes) per block; a row-split Q4 format counts two blocks as one (rows need an even count)."""
    base = FORMATS[_BASE_OF.get(fmt, fmt).name]
    return (2 * base.block_size, 2 * base.type_size) if fmt in _PAIRED else (base.block_size, base.type_size)


@dataclass(frozen=True, slots=True)
class QuantTensor:
    fmt: QFormat
    shape: tuple[int, int]  # [rows, cols] of the matrix it codes
    blocks: torch.Tensor  # uint8 [rows, row_bytes], CPU, contiguous

    def __post_init__(self) -> None:
        block_size, type_size = _block_format(self.fmt)
        rows, cols = self.shape
        if cols % block_size or tuple(self.blocks.shape) != (rows, cols // block_size * type_size):
            raise ValueError(f"{tuple(self.blocks.shape)} bytes do not hold a {self.fmt.name} matrix {self.shape}")

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    def to(self, device: torch.device | str) -> QuantTensor:
        """Quantized weights live on the CPU only (the kernels are CPU kernels)."""
        if torch.device(device).type != "cpu":
            raise ValueError("quantized weights run on the CPU only")
        return self

    def contiguous(self) -> QuantTensor:
        return self

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, cols], equal to the reference dequantizer."""
        g = ggml_blocks(self)
        return dequantize(g.blocks, g.fmt.name, self.shape)

    def rows(self, index: torch.Tensor) -> QuantTensor:
        """The rows `index` (a permutation or selection), as blocks: no value changes."""
        return QuantTensor(self.fmt, (int(index.numel()), self.shape[1]), self.blocks[index].contiguous())


def _interleave_order(nb: int, cb: int) -> torch.Tensor:
    """int64 [cb nb]: position p of a row's interleaved code bytes holds byte order[p] of the
    blocks' codes laid end to end (block b's cb = 16 (Q4) or 32 (Q8) bytes at cb b)."""
    whole = nb // 16 * 16
    # [group][quad c][block j][byte i % 4] <- block 16 group + j, byte 4c + i % 4
    idx = torch.arange(cb * whole).reshape(-1, 16, cb // 4, 4).transpose(1, 2).reshape(-1)
    return torch.cat([idx, torch.arange(cb * whole, cb * nb)])


def _code_bytes(fmt: QFormat) -> int:
    return 32 if fmt in (QFormat.Q8_0, QFormat.Q8_0_ROWS) else 16


def to_kernel_layout(w: QuantTensor) -> QuantTensor:
    """Q8_0, and Q4_0/Q4_1 with an even number of blocks per row -> the row-split layout; others
    unchanged."""
    if w.fmt not in _ROWS_OF or (w.fmt != QFormat.Q8_0 and (w.shape[1] // 32) % 2):
        return w
    rows, sz, nb, cb = w.shape[0], FORMATS[w.fmt.name].type_size, w.shape[1] // 32, _code_bytes(w.fmt)
    blk = w.blocks.reshape(rows, -1, sz)
    codes = blk[:, :, sz - cb :].reshape(rows, -1)[:, _interleave_order(nb, cb)]
    if w.fmt == QFormat.Q8_0:
        codes = codes ^ _Q8_OFFSET
    parts = [codes, blk[:, :, 0:2]] + ([blk[:, :, 2:4]] if w.fmt == QFormat.Q4_1 else [])
    return QuantTensor(_ROWS_OF[w.fmt], w.shape, torch.cat([p.reshape(rows, -1) for p in parts], dim=1))


def ggml_blocks(w: QuantTensor) -> QuantTensor:
    """The GGML block layout of w (inverse of to_kernel_layout)."""
    if w.fmt not in _BASE_OF:
        return w
    base = _BASE_OF[w.fmt]
    rows, nb, cb = w.shape[0], w.shape[1] // 32, _code_bytes(w.fmt)
    codes = torch.empty(rows, cb * nb, dtype=torch.uint8)
    codes[:, _interleave_order(nb, cb)] = w.blocks[:, : cb * nb]
    if w.fmt == QFormat.Q8_0_ROWS:
        codes ^= _Q8_OFFSET
    codes = codes.reshape(rows, nb, cb)
    scales = w.blocks[:, cb * nb :].reshape(rows, -1, nb, 2).transpose(1, 2).reshape(rows, nb, -1)
    return QuantTensor(base, w.shape, torch.cat([scales, codes], dim=2).reshape(rows, -1))


def cat_rows(parts: list) -> torch.Tensor | QuantTensor | tuple:
    """Stack matrices by rows (fused QKV, gate-up): dense tensors with torch.cat, quantized ones of
    one format by their blocks; a mix of formats stays a tuple of parts (Linear runs each)."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts)
    if all(isinstance(p, QuantTensor) for p in parts) and len({p.fmt for p in parts}) == 1:
        rows = sum(p.shape[0] for p in parts)
        return QuantTensor(parts[0].fmt, (rows, parts[0].shape[1]), torch.cat([p.blocks for p in parts]))
    return tuple(parts)


def weight_nbytes(w) -> int:
    if isinstance(w, QuantTensor):
        return w.nbytes
    if isinstance(w, tuple):
        return sum(weight_nbytes(p) for p in w)
    return w.numel() * w.element_size()


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """Round half away from zero (C's roundf, which ggml's quantizers use)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _f16_bytes(d: torch.Tensor) -> torch.Tensor:
    """[n, 1] float32 -> [n, 2] uint8 of float16."""
    return d.to(torch.float16).view(torch.uint8)


def quantize_q8_0(w: torch.Tensor) -> QuantTensor:
    """ggml's quantize_row_q8_0_ref: d = max|x| / 127, q = roundf(x / d) (x * 1/d), d as float16."""
    rows, cols = w.shape
    x = w.float().reshape(-1, 32)
    d = x.abs().amax(dim=1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = _roundf(x * inv).to(torch.int8).view(torch.uint8)
    return QuantTensor(QFormat.Q8_0, (rows, cols), torch.cat([_f16_bytes(d), q], dim=1).reshape(rows, -1))


def quantize_q4_0(w: torch.Tensor) -> QuantTensor:
    """ggml's quantize_row_q4_0_ref: d = (the value of largest magnitude) / -8, q = trunc(x / d + 8.5)
    clipped to 15; byte j holds q_j (low nibble) and q_(j+16) (high nibble)."""
    rows, cols = w.shape
    x = w.float().reshape(-1, 32)
    idx = x.abs().argmax(dim=1, keepdim=True)
    d = torch.gather(x, 1, idx) / -8
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc(x * inv + 8.5).clamp(0, 15).to(torch.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return QuantTensor(QFormat.Q4_0, (rows, cols), torch.cat([_f16_bytes(d), packed], dim=1).reshape(rows, -1))


QUANTIZERS = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0}
