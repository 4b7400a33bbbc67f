"""The elementwise parts of a decoder layer, behind one interface with two implementations:
native fused kernels (CPU) and plain torch (CUDA, or a CPU without the native library).

    add_rms_norm(x, delta, w, out)   x += delta; out = rms_norm(x) * w
    silu_mul(gate_up, out)           out = silu(gate) * up
    gelu_tanh_mul(gate_up, out)      out = gelu_tanh(gate) * up  (Gemma)
    rope_cache(layer, qkv, ...)      RoPE in place on q, k inside qkv; k, v into the paged cache

Each layer has its own Rope (`ropes[layer]`: Gemma 3's local layers turn on another base); a
partial rotary embedding (Phi-3 with partial_rotary_factor) goes through the torch code on every
backend, since the fused kernels rotate whole heads.
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

    ropes: list[Rope]  # per layer

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor
    ) -> None:
        """x += delta (when given), in place; out = rms_norm(x) * weight. x, out: [T, H]."""

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        """out = silu(gate) * up, where gate_up = [gate | up]: [T, 2F] -> out [T, F]."""

    def gelu_tanh_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        """out = gelu(gate, approximate='tanh') * up: [T, 2F] -> out [T, F]."""

    def rope_cache(
        self, layer: int, qkv: torch.Tensor, positions: torch.Tensor, slots: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        """RoPE in place on q and k inside qkv [T, (H + 2 H_kv) D]; k and v into `layer`'s
        paged cache at slots (block ids, offsets), each [T]."""


def gelu_tanh_mul(gate_up: torch.Tensor, out: torch.Tensor) -> None:
    g, u = gate_up.chunk(2, dim=-1)
    torch.mul(F.gelu(g, approximate="tanh"), u, out=out)


def rope_cache_torch(
    cache: KVCache,
    rope: Rope,
    heads: tuple[int, int, int],
    layer: int,
    qkv: torch.Tensor,
    positions: torch.Tensor,
    slots: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """RoPE on the first rope.rotary_dims of each q and k head (in place), k and v into the cache."""
    nh, nkv, d = heads
    T = qkv.shape[0]
    qk = qkv[:, : (nh + nkv) * d].view(T, nh + nkv, d)
    cos, sin = rope.tables(positions)
    r = rope.rotary_dims
    qk[..., :r] = apply_rope(qk[..., :r], cos, sin)
    k = qkv[:, nh * d : (nh + nkv) * d].view(T, nkv, d)
    v = qkv[:, (nh + nkv) * d :].view(T, nkv, d)
    cache.write(layer, slots, k, v)


class TorchOps:
    def __init__(self, cache: KVCache, ropes: list[Rope], heads: tuple[int, int, int], eps: float):
        self.cache, self.ropes, self.heads, self.eps = cache, ropes, heads, eps

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor
    ) -> None:
        if delta is not None:
            x.add_(delta)
        out.copy_(F.rms_norm(x, (x.shape[-1],), weight, self.eps))

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        g, u = gate_up.chunk(2, dim=-1)
        torch.mul(F.silu(g), u, out=out)

    def gelu_tanh_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        gelu_tanh_mul(gate_up, out)

    def rope_cache(
        self, layer: int, qkv: torch.Tensor, positions: torch.Tensor, slots: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        rope_cache_torch(self.cache, self.ropes[layer], self.heads, layer, qkv, positions, slots)


class NativeOps:
    def __init__(
        self, kernels: NativeKernels, cache: KVCache, ropes: list[Rope], heads: tuple[int, int, int], eps: float
    ):
        self.k, self.cache, self.ropes, self.heads, self.eps = kernels, cache, ropes, heads, eps

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor
    ) -> None:
        self.k.add_rms_norm(x, delta, weight, out, self.eps)

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        self.k.silu_mul(gate_up, out)

    def gelu_tanh_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        gelu_tanh_mul(gate_up, out)

    def rope_cache(
        self, layer: int, qkv: torch.Tensor, positions: torch.Tensor, slots: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        rope = self.ropes[layer]
        if not rope.full:
            rope_cache_torch(self.cache, rope, self.heads, layer, qkv, positions, slots)
            return
        self.k.rope_cache(
            qkv, self.heads, rope.cos32, rope.sin32, positions, slots, self.cache.k_of(layer), self.cache.v_of(layer)
        )
