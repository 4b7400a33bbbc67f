"""Rotary position embeddings, rotate-half convention (as Hugging Face Llama/Qwen2).

Frequencies are computed exactly as transformers does (float32, same formula) so that float32
outputs match it; the cos/sin table is built once for all positions.
"""
from __future__ import annotations

import math

import torch

from traceless.model.config import ModelConfig, RopeScaling


def inv_frequencies(config: ModelConfig, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if freq_factors is not None:  # GGUF llama3 models carry precomputed per-frequency factors
        return inv_freq / freq_factors.float()
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    return _llama3(inv_freq, scaling)


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = ((s.original_max_position_embeddings / wavelen - s.low_freq_factor)
              / (s.high_freq_factor - s.low_freq_factor))
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rope:
    def __init__(self, config: ModelConfig, max_positions: int, dtype: torch.dtype, device: torch.device,
                 freq_factors: torch.Tensor | None = None):
        inv_freq = inv_frequencies(config, freq_factors)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # [P, D/2]
        self.cos32 = angles.cos().to(device).contiguous()  # float32, for the fused native kernel
        self.sin32 = angles.sin().to(device).contiguous()
        self.cos = self.cos32.to(dtype)  # model dtype, as transformers applies it
        self.sin = self.sin32.to(dtype)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for these positions: [T, 1, D/2] each (broadcast over heads)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]. Same products and sums as HF's x*cos + rotate_half(x)*sin."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
