"""FP8 tensors of a checkpoint, read for either path, through the loader's take(name) callable
(returns the named tensor and consumes it, or None when absent):

    take = dequantizing_take(take, config, dtype)
        the CPU path: every FP8 <module>.weight comes back dequantized to dtype, its scale tensors
        consumed; everything else passes through. The model then loads as an unquantized one.
    w = read_fp8_weight(take, module, config)
        the GPU path: one Linear's FP8 weight as Fp8Weight (per-channel scales, block-wise
        requantized per channel), for Fp8Linear(w.weight, w.scale, bias, w.input_scale, dtype)
    w = fuse_fp8_weights([q, k, v])
        fused projections (QKV, gate/up): rows and their scales concatenated; static input scales
        folded into their maximum (the parts share one input, so one scale must cover them all)

A static activation scale is applied only by the GPU's FP8 matmul; the CPU path computes in the
dequantized dtype and needs none, so dequantizing_take consumes <module>.input_scale unused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from traceless.errors import ModelLoadError
from traceless.model.fp8.config import Fp8Config, WeightScales
from traceless.model.fp8.convert import FP8, channel_scales, dequantize, requantize_blocks

Take = Callable[[str], torch.Tensor | None]
_WEIGHT = ".weight"


@dataclass(frozen=True, slots=True)
class Fp8Weight:
    weight: torch.Tensor  # [N, K] float8_e4m3fn
    scale: torch.Tensor  # [N] float32, one per output row
    input_scale: torch.Tensor | None  # [] float32 for static activations, None for dynamic


def _scales(take: Take, module: str, config: Fp8Config) -> tuple[torch.Tensor, torch.Tensor | None]:
    scale = take(f"{module}.{config.weight_scale_name}")
    if scale is None:
        raise ModelLoadError(f"weights lack tensor {module + '.' + config.weight_scale_name!r} (FP8 scale)")
    input_scale = take(module + ".input_scale")
    if (input_scale is None) != (config.activations.value == "dynamic"):
        want = "no input_scale (dynamic activations)" if input_scale is not None else "an input_scale"
        raise ModelLoadError(f"FP8 module {module!r}: expected {want}")
    return scale, input_scale


def dequantizing_take(take: Take, config: Fp8Config, dtype: torch.dtype) -> Take:
    """take, with every FP8 weight dequantized to dtype on the way out (the dtype decides: the
    ignore lists of published checkpoints do not always name every unquantized Linear)."""

    def wrapped(name: str) -> torch.Tensor | None:
        t = take(name)
        if t is None or not name.endswith(_WEIGHT):
            return t
        if t.dtype != FP8:  # norms, embeddings, routers, ignored modules: stored unquantized
            return t
        module = name[: -len(_WEIGHT)]
        if not config.quantizes(module):
            raise ModelLoadError(f"tensor {name!r} is FP8, but the FP8 config leaves its module unquantized")
        scale, _ = _scales(take, module, config)
        return dequantize(t, scale, config, dtype)

    return wrapped


def read_fp8_weight(take: Take, module: str, config: Fp8Config) -> Fp8Weight:
    """<module>.weight and its scales -> Fp8Weight with one scale per output row."""
    weight = take(module + _WEIGHT)
    if weight is None or weight.dtype != FP8 or weight.dim() != 2:
        got = None if weight is None else f"{weight.dtype} {tuple(weight.shape)}"
        raise ModelLoadError(f"tensor {module + _WEIGHT!r} is {got}, expected a float8_e4m3fn matrix")
    scale, input_scale = _scales(take, module, config)
    if config.weight_scales is WeightScales.BLOCK and config.block is not None:
        weight, rows = requantize_blocks(weight, scale, config.block)
    else:
        rows = channel_scales(scale, config, weight.shape[0]).contiguous()
    return Fp8Weight(weight, rows, None if input_scale is None else input_scale.float().reshape(()))


def fuse_fp8_weights(parts: list[Fp8Weight]) -> Fp8Weight:
    """Projections that read the same input, stacked by rows."""
    statics = [p.input_scale for p in parts if p.input_scale is not None]
    if statics and len(statics) != len(parts):
        raise ModelLoadError("fused FP8 projections mix static and dynamic activation scales")
    if len(statics) > 1 and not all(torch.equal(s, statics[0]) for s in statics):
        # a larger activation scale for some parts re-rounds their inputs more coarsely; what vLLM does too
        input_scale: torch.Tensor | None = torch.stack(statics).max()
    else:
        input_scale = statics[0] if statics else None
    return Fp8Weight(torch.cat([p.weight for p in parts]), torch.cat([p.scale for p in parts]), input_scale)
