"""Rotary position embeddings, rotate-half convention (as Hugging Face Llama/Qwen/Gemma/Phi-3).

Frequencies are computed exactly as transformers does (float32, same formula) so that float32
outputs match it; the cos/sin table is built once for all positions. With a partial rotary factor
only the first `rotary_dims` of each head turn (the table is [P, rotary_dims / 2]).

LongRoPE (Phi-3 128k, Phi-4-mini): transformers picks the short or the long factors per forward
pass from the largest position it sees: long when max(position) + 1 > original_max_position_
embeddings (L). Its `generate` runs the prompt in one pass, then one token per pass, and Phi-3's
`prepare_inputs_for_generation` drops the KV cache at the pass that first reaches L + 1 tokens, so
that pass recomputes the whole sequence on the long factors. In effect a sequence of n tokens is
computed

    on the short factors  while n <= L (all its positions are < L)
    on the long factors   from the step its length passes L: all of it, recomputed once

We reproduce that per sequence, whatever the chunking or the batch: the scheduler recomputes a
sequence when its length passes L (and keeps its drafts below L until then), and the table holds
2P rows, [0, P) short and [P, 2P) long; a long sequence reads row P + p (`Rope.shift`).
"""

from __future__ import annotations

import math

import torch

from traceless.model.config import LayerRope, ModelConfig, RopeScaling


def inv_frequencies(
    config: ModelConfig, freq_factors: torch.Tensor | None = None, layer: LayerRope | None = None, long: bool = False
) -> torch.Tensor:
    """[rotary_dims / 2] float32. `layer`: the rope of a kind of layer (default: the global one);
    `long`: LongRoPE's long factors instead of the short ones."""
    layer = layer or LayerRope(config.rope_theta, config.rope_scaling)
    dim = config.rotary_dims
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    scaling = layer.scaling
    if scaling is not None and scaling.kind == "longrope":
        factors = torch.tensor(scaling.long_factor if long else scaling.short_factor, dtype=torch.float32)
        return 1.0 / (factors * layer.theta**exponents)
    inv_freq = 1.0 / (layer.theta**exponents)
    if freq_factors is not None:  # GGUF llama3 models carry precomputed per-frequency factors
        return inv_freq / freq_factors.float()
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "yarn":
        return _yarn(layer.theta**exponents, scaling, layer.theta, dim)
    return _llama3(inv_freq, scaling)


def _yarn(pos_freqs: torch.Tensor, s: RopeScaling, theta: float, dim: int) -> torch.Tensor:
    """YaRN (gpt-oss), as transformers computes it: frequencies that turn fewer than beta_slow
    times over the original context are interpolated (divided by the factor), those turning more
    than beta_fast times kept, a linear ramp over the dimensions between."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return 1.0 / (s.factor * pos_freqs) * (1 - extrapolation) + 1.0 / pos_freqs * extrapolation


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rope:
    def __init__(
        self,
        config: ModelConfig,
        max_positions: int,
        dtype: torch.dtype,
        device: torch.device,
        freq_factors: torch.Tensor | None = None,
        layer: LayerRope | None = None,
    ):
        layer = layer or LayerRope(config.rope_theta, config.rope_scaling)
        s = layer.scaling
        self.rotary_dims = config.rotary_dims
        self.full = self.rotary_dims == config.head_dim  # the fused kernels rotate whole heads only
        self.long_from: int | None = None
        positions = torch.arange(max_positions, dtype=torch.float32)
        if s is not None and s.kind == "longrope":
            self.long_from = s.original_max_position_embeddings
            short = torch.outer(positions, inv_frequencies(config, None, layer))
            long = torch.outer(positions, inv_frequencies(config, None, layer, long=True))
            angles = torch.cat([short, long])  # [2P, R/2]: see the module docstring
            mult = s.attention_factor
        else:
            angles = torch.outer(positions, inv_frequencies(config, freq_factors, layer))  # [P, R/2]
            mult = s.attention_factor if s is not None and s.kind == "yarn" else 1.0
        self.num_positions = max_positions
        cos, sin = angles.cos(), angles.sin()
        if mult != 1.0:  # as transformers scales them: float32 cos/sin times the attention factor
            cos, sin = cos * mult, sin * mult
        self.cos32 = cos.to(device).contiguous()  # float32, for the fused kernels
        self.sin32 = sin.to(device).contiguous()
        self.cos = self.cos32.to(dtype)  # model dtype, as transformers applies it
        self.sin = self.sin32.to(dtype)

    def shift(self, long_context: bool) -> int:
        """Offset added to a sequence's positions to index the table: LongRoPE's long rows for a
        sequence longer than the original context; else 0."""
        return self.num_positions if self.long_from is not None and long_context else 0

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for these positions: [T, 1, R/2] each (broadcast over heads)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, R] (the rotary part of each head). Same products and sums as HF's
    x*cos + rotate_half(x)*sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
