"""The CUDA implementations of the decoder's element-wise ops (DecoderOps) and of paged attention,
on the Triton kernels of triton_kernels.py. Every launch has fixed shapes for a fixed number of
rows and reads its metadata from tensors, so a decode step can be captured as a CUDA graph."""

from __future__ import annotations

import torch

from traceless.model.layers import triton_kernels as tk
from traceless.model.layers.attention import AttentionMetadata
from traceless.model.layers.kv_cache import KVCache
from traceless.model.layers.ops import gelu_tanh_mul, rope_cache_torch
from traceless.model.rope import Rope


class TritonOps:
    def __init__(self, cache: KVCache, ropes: list[Rope], heads: tuple[int, int, int], eps: float):
        self.cache, self.ropes, self.heads, self.eps = cache, ropes, heads, eps

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor
    ) -> None:
        tk.add_rms_norm(x, delta, weight, out, self.eps)

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        tk.silu_mul(gate_up, out)

    def gelu_tanh_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        gelu_tanh_mul(gate_up, out)  # torch: Gemma's MLP is not on the Triton kernels yet

    def rope_cache(
        self, layer: int, qkv: torch.Tensor, positions: torch.Tensor, slots: tuple[torch.Tensor, torch.Tensor]
    ) -> None:
        rope = self.ropes[layer]  # cos32/sin32: [P, D / 2] float32
        if not rope.full:
            rope_cache_torch(self.cache, rope, self.heads, layer, qkv, positions, slots)
            return
        tk.rope_cache(
            qkv, self.heads, rope.cos32, rope.sin32, positions, slots, self.cache.k_of(layer), self.cache.v_of(layer)
        )


class TritonAttention:
    """Paged attention for every row of the step in one launch per layer (meta.paged)."""

    def __init__(
        self, cache: KVCache, heads: tuple[int, int, int], windows: tuple[int, ...] = (), softcap: float | None = None
    ):
        self.cache = cache
        self.heads = heads  # (num_heads, num_kv_heads, head_dim)
        self.windows = windows  # per layer: keys a query sees (0: all); empty: no windows
        self.softcap = softcap  # attention logit soft-capping (Gemma 2), or None
        device = cache.k.device
        # small decode batches split their keys across the multiprocessors (flash-decoding)
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0

    def __call__(
        self, layer: int, qkv: torch.Tensor, meta: AttentionMetadata, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        """qkv: [T, (H + 2 H_kv) D] after RoPE, this step's K/V already in the cache -> [T, H, D].
        sinks: [H] float32, the layer's attention sinks (gpt-oss), or None."""
        nh, _, d = self.heads
        pb = meta.paged
        if pb is None:
            raise RuntimeError("the Triton attention needs the step's paged metadata")
        T = qkv.shape[0]
        q = qkv[:, : nh * d].view(T, nh, d)  # strided view: no copy
        out = q.new_empty(T, nh, d)  # every row is written (padding rows of a captured batch: zeros)
        tk.paged_attention(
            q,
            self.cache.k_of(layer),
            self.cache.v_of(layer),
            out,
            pb.block_tables,
            pb.cu_q,
            pb.context_lens,
            meta.scale,
            pb.max_q,
            self.num_sms,
            self.windows[layer] if self.windows else 0,
            sinks,
            self.softcap,
        )
        return out
