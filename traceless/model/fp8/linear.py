"""A Linear with FP8 (e4m3) weights: on CUDA (Hopper and later) the matmul runs in FP8 with
torch._scaled_mm; elsewhere the same arithmetic is emulated in float32 (the reference the GPU
path is tested against; the CPU serving path dequantizes at load instead).

    lin = Fp8Linear(weight, weight_scale, bias, input_scale, out_dtype)
        weight [N, K] float8_e4m3fn, weight_scale [N] float32 (per channel; a per-tensor scale
        expanded), bias [N] or None, input_scale: a scalar tensor (static activations) or None
        (dynamic: per-token scales computed each call)
    y = lin(x)                                x [T, K] -> y [T, N] in out_dtype

    y[t, n] = (sum_k q_x[t, k] q_w[n, k]) * s_x[t] * s_w[n] + b[n]

The per-token activation scale makes each token's result independent of the rest of the batch.
"""

from __future__ import annotations

import torch

from traceless.errors import ModelLoadError
from traceless.model.fp8.convert import FP8, quantize_per_channel, quantize_per_token, quantize_static

_ALIGN = 16  # torch._scaled_mm needs K and N to be multiples of 16


class Fp8Linear:
    __slots__ = ("weight", "weight_scale", "bias", "input_scale", "out_dtype")

    def __init__(
        self,
        weight: torch.Tensor,
        weight_scale: torch.Tensor,
        bias: torch.Tensor | None,
        input_scale: torch.Tensor | None,
        out_dtype: torch.dtype,
    ):
        N, K = weight.shape
        if weight.dtype != FP8:
            raise ModelLoadError(f"Fp8Linear weight of dtype {weight.dtype}, expected float8_e4m3fn")
        if N % _ALIGN or K % _ALIGN:
            raise ModelLoadError(f"Fp8Linear weight of shape {(N, K)}: both sizes must be multiples of {_ALIGN}")
        if tuple(weight_scale.shape) != (N,):
            raise ModelLoadError(f"Fp8Linear weight scale of shape {tuple(weight_scale.shape)}, expected {(N,)}")
        if input_scale is not None and input_scale.numel() != 1:
            raise ModelLoadError(
                f"Fp8Linear static input scale of shape {tuple(input_scale.shape)}, expected one value"
            )
        if weight.is_cuda and out_dtype != torch.bfloat16:
            raise ModelLoadError(f"Fp8Linear on CUDA computes in bfloat16 (row-wise scaled FP8), not {out_dtype}")
        self.weight = weight.contiguous()  # [N, K] row-major: weight.t() is the column-major B of _scaled_mm
        self.weight_scale = weight_scale.float().reshape(1, N)
        self.bias = None if bias is None else bias.to(out_dtype)
        self.input_scale = None if input_scale is None else input_scale.float().reshape(1, 1)
        self.out_dtype = out_dtype

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype) -> Fp8Linear:
        """A bf16/f32 weight [N, K] quantized per output channel, activations dynamic per token:
        what `--quantization fp8` makes of each Linear of an unquantized checkpoint."""
        q, scale = quantize_per_channel(weight)
        return cls(q, scale, bias, None, out_dtype)

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, K] -> (float8 [T, K], scales [T, 1] float32)."""
        if self.input_scale is None:
            return quantize_per_token(x)
        return quantize_static(x, self.input_scale), self.input_scale.expand(x.shape[0], 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        q, scale = self.quantize_input(x)
        if x.is_cuda:
            # row-wise scaling: scale_a [T, 1], scale_b [1, N], both float32, bfloat16 out; the bias
            # is added after (not every torch version takes a bias with row-wise scales)
            y = torch._scaled_mm(
                q, self.weight.t(), scale_a=scale.contiguous(), scale_b=self.weight_scale, out_dtype=self.out_dtype
            )
            return y if self.bias is None else y.add_(self.bias)
        return self.emulate(q, scale)

    def emulate(self, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The FP8 matmul in float32 arithmetic: exact products of e4m3 values, float32 sums."""
        y = (q.float() @ self.weight.float().t()) * scale * self.weight_scale
        if self.bias is not None:
            y += self.bias.float()
        return y.to(self.out_dtype)
