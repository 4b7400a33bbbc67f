"""The model's matmuls: y = x W^T + b over dense or quantized weights, and the embedding lookup.

    dense     a torch tensor; on CPU in bfloat16 prepacked for oneDNN, which runs the small-batch
              matmuls of decoding about twice as fast as the plain path (same results)
    quantized a QuantTensor (layers/quant.py): GGML blocks multiplied by the native int8 kernels
              (csrc/qmatmul.c), float32 activations in and out, for every number of rows: one
              numeric path, so a row's result never depends on the rows that share its call (a
              request's output on the batch it shares), and no dequantized copy of a weight
    stacked   a tuple of parts of either kind (a fused QKV whose tensors came in different
              formats): each part writes its own columns of y

Every matmul of the model goes through `Linear`, which is built from the weight alone.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F

from traceless.model.layers.quant import QuantTensor, cat_rows, weight_nbytes

__all__ = ["Linear", "QuantTensor", "cat_rows", "embedding", "weight_nbytes"]


@lru_cache(maxsize=1)
def quant_kernels():
    """The quantized kernels, loaded once (an immutable library handle)."""
    from traceless.model.layers.qkernels import load_quant_kernels

    return load_quant_kernels()


class _Dense:
    __slots__ = ("weight", "bias", "packed")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool):
        self.bias = bias
        self.packed = pack
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1) if pack else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class _Quant:
    """Quantized weight parts [N_i, K] stacked by rows; y: float32 [T, sum N_i]."""

    __slots__ = ("parts", "bias", "out_features", "bound")

    def __init__(self, parts: tuple, bias: torch.Tensor | None):
        self.parts = parts
        self.bias = None if bias is None else bias.float().contiguous()
        self.out_features = sum(p.shape[0] for p in parts)
        kernels = quant_kernels()
        self.bound = [kernels.bind(p) if isinstance(p, QuantTensor) else None for p in parts]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty(x.shape[0], self.out_features, dtype=torch.float32)
        col = 0
        for p, bound in zip(self.parts, self.bound):
            n = p.shape[0]
            bias = None if self.bias is None else self.bias[col : col + n]
            if bound is not None:
                bound(x if x.dtype == torch.float32 else x.float(), y, col, None if bias is None else bias.data_ptr())
            else:
                y[:, col : col + n] = F.linear(x.to(p.dtype), p, None if bias is None else bias.to(p.dtype))
            col += n
        return y


class Linear:
    """y = x W^T + b, W dense (torch tensor), quantized (QuantTensor) or a tuple of parts."""

    __slots__ = ("impl",)

    def __init__(self, weight, bias: torch.Tensor | None, pack: bool):
        if isinstance(weight, torch.Tensor):
            self.impl: _Dense | _Quant = _Dense(weight, bias, pack)
        else:
            self.impl = _Quant(weight if isinstance(weight, tuple) else (weight,), bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.impl(x)

    def quantized(self) -> tuple[tuple, torch.Tensor | None] | None:
        """(parts, float32 bias or None) of a quantized weight; None for a dense one."""
        return (self.impl.parts, self.impl.bias) if isinstance(self.impl, _Quant) else None


def embedding(table, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` [T] of the embedding table: [T, hidden] (float32 for a quantized table, whose
    rows are dequantized exactly as the reference dequantizer does)."""
    if isinstance(table, QuantTensor):
        return quant_kernels().embed(table, ids, torch.float32)
    return F.embedding(ids, table)
