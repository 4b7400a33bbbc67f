"""The elementwise parts of a decoder layer, behind one interface with two implementations:
native fused kernels (CPU) and plain torch (CUDA, or a CPU without the native library).

    add_rms_norm(x, delta, w, out)   x += delta; out = rms_norm(x) * w
    silu_mul(gate_up, out)           out = silu(gate) * up
    rope_cache(layer, qkv, ...)      RoPE in place on q, k inside qkv; k, v into the paged cache
"""
from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from traceless.model.layers.kernels import NativeKernels
from traceless.model.layers.kv_cache import KVCache
from traceless.model.rope import Rope, apply_rope


class DecoderOps(Protocol):
    """What LlamaModel needs of the element-wise ops; TorchOps and NativeOps implement it."""

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     out: torch.Tensor) -> None:
        """x += delta (when given), in place; out = rms_norm(x) * weight. x, out: [T, H]."""

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        """out = silu(gate) * up, where gate_up = [gate | up]: [T, 2F] -> out [T, F]."""

    def rope_cache(self, layer: int, qkv: torch.Tensor, positions: torch.Tensor,
                   slots: tuple[torch.Tensor, torch.Tensor]) -> None:
        """RoPE in place on q and k inside qkv [T, (H + 2 H_kv) D]; k and v into `layer`'s
        paged cache at slots (block ids, offsets), each [T]."""


class TorchOps:
    def __init__(self, cache: KVCache, rope: Rope, heads: tuple[int, int, int], eps: float):
        self.cache, self.rope, self.heads, self.eps = cache, rope, heads, eps

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     out: torch.Tensor) -> None:
        if delta is not None:
            x.add_(delta)
        out.copy_(F.rms_norm(x, (x.shape[-1],), weight, self.eps))

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        g, u = gate_up.chunk(2, dim=-1)
        torch.mul(F.silu(g), u, out=out)

    def rope_cache(self, layer: int, qkv: torch.Tensor, positions: torch.Tensor,
                   slots: tuple[torch.Tensor, torch.Tensor]) -> None:
        nh, nkv, d = self.heads
        T = qkv.shape[0]
        qk = qkv[:, : (nh + nkv) * d].view(T, nh + nkv, d)
        cos, sin = self.rope.tables(positions)
        qk.copy_(apply_rope(qk, cos, sin))
        k = qkv[:, nh * d : (nh + nkv) * d].view(T, nkv, d)
        v = qkv[:, (nh + nkv) * d :].view(T, nkv, d)
        self.cache.write(layer, slots, k, v)


class NativeOps:
    def __init__(self, kernels: NativeKernels, cache: KVCache, rope: Rope, heads: tuple[int, int, int], eps: float):
        self.k, self.cache, self.heads, self.eps = kernels, cache, heads, eps
        self.cos, self.sin = rope.cos32, rope.sin32

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     out: torch.Tensor) -> None:
        self.k.add_rms_norm(x, delta, weight, out, self.eps)

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        self.k.silu_mul(gate_up, out)

    def rope_cache(self, layer: int, qkv: torch.Tensor, positions: torch.Tensor,
                   slots: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.k.rope_cache(qkv, self.heads, self.cos, self.sin, positions, slots,
                          self.cache.k[layer], self.cache.v[layer])
