"""MXFP4 dequantization (OCP microscaling: 4-bit e2m1 values in blocks of 32 that share one E8M0
power-of-two scale): gpt-oss's expert weights, dequantized at load.

    weight = dequantize_mxfp4(blocks, scales, dtype)
        blocks [..., R, G, 16] uint8   R rows of G blocks; each byte two values, low nibble first
        scales [..., R, G] uint8       E8M0: the block's scale is 2^(s - 127); 255 (NaN) is refused
        weight [..., R, G * 32]        in dtype (exact in float32 and bfloat16: every value is a
                                       small power-of-two multiple)

gpt-oss stores each layer's experts as <proj>_blocks / <proj>_scales with rows = output features,
so for gate_up the result is [E, 2I, H] with gate and up rows interleaved
(moe.deinterleave_gate_up makes it the MoE block's layout) and for down [E, H, I].
"""

from __future__ import annotations

import torch

from traceless.errors import ModelLoadError

# e2m1: sign, 2 exponent bits (bias 1), 1 mantissa bit; code c -> FP4_VALUES[c]
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_E8M0_BIAS = 127
_E8M0_NAN = 255


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """blocks [..., R, G, 16] uint8, scales [..., R, G] uint8 -> [..., R, G * 32] dtype. Converted
    one slice of the leading dimension at a time, so the float32 temporaries stay one expert big."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ModelLoadError(f"MXFP4 blocks/scales of dtypes {blocks.dtype}/{scales.dtype}, expected uint8")
    if blocks.dim() < 3 or blocks.shape[-1] != 16 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ModelLoadError(
            f"MXFP4 blocks of shape {tuple(blocks.shape)} do not fit scales of shape "
            f"{tuple(scales.shape)} ([..., R, G, 16] and [..., R, G])"
        )
    if bool((scales == _E8M0_NAN).any()):
        raise ModelLoadError("MXFP4 scales hold the E8M0 NaN code (255)")
    *lead, R, G, _ = blocks.shape
    out = torch.empty(*lead, R, G * 32, dtype=dtype, device=blocks.device)
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    flat_blocks, flat_scales, flat_out = blocks.reshape(-1, R, G, 16), scales.reshape(-1, R, G), out.view(-1, R, G * 32)
    for i in range(flat_blocks.shape[0]):
        b = flat_blocks[i].long()
        values = torch.stack([lut[b & 0xF], lut[b >> 4]], dim=-1).view(R, G, 32)  # low nibble first
        exp = flat_scales[i].int() - _E8M0_BIAS
        flat_out[i] = torch.ldexp(values, exp[..., None]).view(R, G * 32).to(dtype)
    return out
