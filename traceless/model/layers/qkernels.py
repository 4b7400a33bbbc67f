"""ctypes binding of the quantized-weight kernels in csrc/qmatmul.c (same library as kernels.py).

Instruction sets: `Isa.AVX512` (AVX-512 VNNI int8 dot products), `Isa.AVX2` (AVX2 + FMA) and
`Isa.PORTABLE` (plain C). `QuantKernels.isa` is the best one this CPU has, capped by
TRACELESS_CPU_ISA=avx2|portable; a call may ask for any lower one (the tests run every path).
"""

from __future__ import annotations

import ctypes
from enum import IntEnum

import torch

from traceless.model.layers.kernels import KernelUnavailable, NativeKernels
from traceless.model.layers.quant import QuantTensor

_P, _L, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int


class Isa(IntEnum):
    PORTABLE = 0
    AVX2 = 1
    AVX512 = 2


class _QShape(ctypes.Structure):
    _fields_ = [("fmt", ctypes.c_int), ("rows", ctypes.c_long), ("cols", ctypes.c_long), ("row_bytes", ctypes.c_long)]


def _shape(w: QuantTensor) -> _QShape:
    return _QShape(w.fmt.value, w.shape[0], w.shape[1], w.blocks.shape[1])


_OUT_DTYPES = (torch.float32, torch.bfloat16)


class QuantKernels:
    def __init__(self, native: NativeKernels):
        lib = native._lib
        self._matmul = native._fn("tl_qmatmul", [ctypes.POINTER(_QShape), _P, _P, _L, _I, _P, _L, _I, _P, _I], _I)
        self._dequant = native._fn("tl_qdequant", [ctypes.POINTER(_QShape), _P, _P, _L, _P, _I], _I)
        self.isa = Isa(lib.tl_q_isa())

    @classmethod
    def load(cls) -> QuantKernels:
        return cls(NativeKernels.load())

    def matmul(
        self,
        x: torch.Tensor,
        w: QuantTensor,
        out: torch.Tensor,
        bias: torch.Tensor | None = None,
        isa: Isa | None = None,
    ) -> None:
        """out[T, N] (a column slice of a wider row-major matrix is fine) = x[T, K] W^T + bias.
        x: float32 or bfloat16, contiguous; bias: float32 [N] or None."""
        T, K = x.shape
        if K != w.shape[1] or tuple(out.shape) != (T, w.shape[0]) or out.stride(1) != 1:
            raise ValueError(f"matmul of {tuple(x.shape)} by {w.shape} into {tuple(out.shape)}")
        if x.dtype not in _OUT_DTYPES or out.dtype not in _OUT_DTYPES or not x.is_contiguous():
            raise ValueError("quantized matmul takes contiguous float32 or bfloat16 activations")
        if bias is not None and (bias.dtype != torch.float32 or bias.numel() != w.shape[0]):
            raise ValueError("bias must be float32 [N]")
        shape = _shape(w)
        rc = self._matmul(
            ctypes.byref(shape),
            w.blocks.data_ptr(),
            x.data_ptr(),
            T,
            int(x.dtype == torch.bfloat16),
            out.data_ptr(),
            out.stride(0),
            int(out.dtype == torch.bfloat16),
            None if bias is None else bias.data_ptr(),
            int(self.isa if isa is None else isa),
        )
        if rc == 1:
            raise MemoryError("quantized matmul could not allocate its scratch memory")
        if rc != 0:
            raise ValueError(f"quantized matmul refused {w.fmt.name} {w.shape} on instruction set {isa}")

    def bind(self, w: QuantTensor) -> BoundMatmul:
        """A matmul by w with its arguments prepared once (the per-step path: ~3 us a call)."""
        return BoundMatmul(self._matmul, w, int(self.isa))

    def embed(self, w: QuantTensor, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` (int64 [T]) of w, dequantized as the reference does: [T, cols] in dtype."""
        ids = ids.to(torch.int64).contiguous()
        return self._rows(w, ids, ids.numel(), dtype)

    def dequantize(self, w: QuantTensor, dtype: torch.dtype) -> torch.Tensor:
        """The whole matrix, [rows, cols] in dtype (float32 equal to the reference to the bit)."""
        return self._rows(w, None, w.shape[0], dtype)

    def _rows(self, w: QuantTensor, ids: torch.Tensor | None, n: int, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in _OUT_DTYPES:
            raise ValueError("dequantized rows are float32 or bfloat16")
        out = torch.empty(n, w.shape[1], dtype=dtype)
        shape = _shape(w)
        rc = self._dequant(
            ctypes.byref(shape),
            w.blocks.data_ptr(),
            None if ids is None else ids.data_ptr(),
            n,
            out.data_ptr(),
            int(dtype == torch.bfloat16),
        )
        if rc == 1:
            raise MemoryError("dequantization could not allocate its scratch memory")
        if rc != 0:
            raise ValueError("token id out of the embedding's range")
        return out


class BoundMatmul:
    """y[:, col:col + N] = x W^T + bias for float32 x [T, K] (contiguous) and float32 y [T, ldy]."""

    __slots__ = ("_fn", "_shape", "_ref", "_w", "_ptr", "_isa", "rows", "cols")

    def __init__(self, fn, w: QuantTensor, isa: int):
        self._fn, self._w, self._isa = fn, w, isa  # _w keeps the blocks alive
        self._shape = _shape(w)
        self._ref = ctypes.byref(self._shape)
        self._ptr = w.blocks.data_ptr()
        self.rows, self.cols = w.shape

    def __call__(self, x: torch.Tensor, y: torch.Tensor, col: int, bias_ptr: int | None) -> None:
        if (
            x.dtype != torch.float32
            or y.dtype != torch.float32
            or x.shape[1] != self.cols
            or not x.is_contiguous()
            or col + self.rows > y.shape[1]
            or y.stride(1) != 1
        ):
            raise ValueError(f"quantized matmul of {tuple(x.shape)} by {self._w.shape}")
        rc = self._fn(
            self._ref,
            self._ptr,
            x.data_ptr(),
            x.shape[0],
            0,
            y.data_ptr() + 4 * col,
            y.stride(0),
            0,
            bias_ptr,
            self._isa,
        )
        if rc == 1:
            raise MemoryError("quantized matmul could not allocate its scratch memory")
        if rc != 0:
            raise ValueError(f"quantized matmul refused {self._w.fmt.name} {self._w.shape}")


def load_quant_kernels() -> QuantKernels:
    try:
        return QuantKernels.load()
    except KernelUnavailable as exc:
        raise KernelUnavailable(f"quantized weights need the native kernels: {exc}") from None
