"""FP8 (e4m3) weights and activations: dequantization at load, quantization at load and at run time.

    dequantize(weight, scale, config, dtype)      [N, K] float8 + its scales -> [N, K] dtype (the CPU
                                                  path, and any Linear the GPU path keeps in bf16)
    quantize_per_channel(weight)                  [N, K] bf16/f32 -> (float8 [N, K], scales [N] f32):
                                                  `--quantization fp8` on a bf16 checkpoint
    channel_scales(scale, config, rows)           a checkpoint's per-tensor or per-channel scales as [N]
    requantize_blocks(weight, scale_inv, block)   block-wise -> per-channel FP8 (for the GPU matmul)
    quantize_per_token(x)                         [T, K] -> (float8 [T, K], scales [T, 1] f32): dynamic
                                                  activations
    quantize_static(x, input_scale)               [T, K] -> float8 [T, K] with one calibrated scale

A value v is stored as q = v / s rounded to e4m3 (saturated to +-448) and read back as q * s, with
s = max |v| / 448 over the group the scale covers, so the largest value of the group is exact.
One tensor at a time: nothing here holds more than the tensor being converted.
"""

from __future__ import annotations

import torch

from traceless.errors import ModelLoadError
from traceless.model.fp8.config import Fp8Config, WeightScales

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
# a group of zeros still gets a positive scale (any scale reads zeros back as zeros)
_MIN_AMAX = 1e-12


def dequantize(weight: torch.Tensor, scale: torch.Tensor, config: Fp8Config, dtype: torch.dtype) -> torch.Tensor:
    """weight [N, K] float8_e4m3fn; scale as the checkpoint stores it for config.weight_scales ->
    [N, K] in dtype, computed in float32."""
    if weight.dtype != FP8 or weight.dim() != 2:
        raise ModelLoadError(
            f"FP8 weight of dtype {weight.dtype} and shape {tuple(weight.shape)}, expected float8_e4m3fn [N, K]"
        )
    w = weight.float()
    if config.block is not None:  # the parser sets it exactly when weight_scales is BLOCK
        return (w * _expand_blocks(scale, weight.shape, config.block)).to(dtype)
    return (w * channel_scales(scale, config, weight.shape[0])[:, None]).to(dtype)


def channel_scales(scale: torch.Tensor, config: Fp8Config, rows: int) -> torch.Tensor:
    """A per-tensor ([] or [1]) or per-channel ([N] or [N, 1]) weight scale -> [N] float32."""
    s = scale.float().reshape(-1)
    if config.weight_scales is WeightScales.TENSOR and s.numel() == 1:
        return s.expand(rows)
    if config.weight_scales is WeightScales.CHANNEL and s.numel() == rows:
        return s
    raise ModelLoadError(
        f"{config.weight_scales.value} weight scale of shape {tuple(scale.shape)} for a weight of {rows} rows"
    )


def _expand_blocks(scale: torch.Tensor, shape: torch.Size, block: tuple[int, int]) -> torch.Tensor:
    """scale [ceil(N / bn), ceil(K / bk)] -> [N, K]: each tile's scale over its bn x bk elements
    (the last tile of a row or column may be partial)."""
    (N, K), (bn, bk) = shape, block
    want = (-(-N // bn), -(-K // bk))
    if tuple(scale.shape) != want:
        raise ModelLoadError(
            f"block weight scale of shape {tuple(scale.shape)}, expected {want} "
            f"for a weight of {(N, K)} in blocks of {block}"
        )
    s = scale.float().repeat_interleave(bn, 0).repeat_interleave(bk, 1)
    return s[:N, :K]


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (float8 [N, K], scales [N] float32), one scale per output row."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=_MIN_AMAX) / FP8_MAX
    return _to_fp8(w / scale[:, None]), scale


def requantize_blocks(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """A block-wise FP8 weight -> per-channel FP8 (float8 [N, K], scales [N]), for a matmul that
    takes one scale per row. A second rounding: each element moves by at most half an e4m3 step
    of its new scale (tests/model/fp8 bound it)."""
    w = weight.float() * _expand_blocks(scale_inv, weight.shape, block)
    return quantize_per_channel(w)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (float8 [T, K], scales [T, 1] float32): one scale per row, so a token's
    quantization never depends on the other tokens of the batch."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=_MIN_AMAX) / FP8_MAX
    return _to_fp8(xf / scale), scale


def quantize_static(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """x [T, K] -> float8 [T, K] with the checkpoint's per-tensor activation scale (values beyond
    its calibrated range saturate at +-448)."""
    return _to_fp8(x.float() / input_scale.float().reshape(()))


def _to_fp8(v: torch.Tensor) -> torch.Tensor:
    # saturate: a cast of a value beyond 448 would give NaN (e4m3fn has no infinity)
    return v.clamp(-FP8_MAX, FP8_MAX).to(FP8)
