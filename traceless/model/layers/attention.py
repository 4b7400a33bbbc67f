"""Paged attention for one step's packed tokens, all sequences of the batch at once.

Token rows are ordered: first the "short" sequences (at most runner/batch.py's SHORT_MAX_TOKENS new
tokens: decode, short prompts and chunks), then the "long" ones (longer prefill chunks).

    rows [0, short.num_tokens)        native kernel, reads K/V through the block tables
    rows [short.num_tokens, T)        SDPA; queries padded to [B, max_q], keys either this step's
                                      own K/V (fresh prompts) or the context gathered from the cache

Without the native kernel (CUDA, or a CPU build without it) every sequence is "long".
All index tensors and masks are built once per step by the model runner and shared by all layers.

Sliding windows (Mistral, Gemma's local layers, Phi-3): a query at position p of a windowed layer
sees keys (p - W, p], as transformers' sliding-window mask. The native kernel skips the blocks
below; SDPA takes the step's window mask. Attention soft-capping (Gemma 2) and sinks (gpt-oss: a
learned logit per head that joins each softmax's denominator and attends to nothing) replace SDPA
by the same math written out (scores, cap * tanh(scores / cap), mask, softmax over the scores and
the sink, the sink's share dropped), as transformers' eager attention computes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from traceless.model.layers.kernels import NativeKernels, PagedAttentionArgs
from traceless.model.layers.kv_cache import KVCache


@dataclass(frozen=True, slots=True)
class ShortBatch:
    num_tokens: int
    block_tables: torch.Tensor  # [B, max_blocks] int32
    cu_q: torch.Tensor  # [B + 1] int32
    context_lens: torch.Tensor  # [B] int32, keys per sequence including its new tokens


@dataclass(frozen=True, slots=True)
class LongBatch:
    num_seqs: int
    max_q: int
    fresh: bool  # no sequence has cached context: keys are exactly this step's tokens
    block_tables: torch.Tensor | None  # [B, max_blocks] int64, when not fresh
    row_seq: torch.Tensor | None  # [T_long] sequence of each row (None when B == 1)
    row_pos: torch.Tensor | None  # [T_long] row index inside its sequence's query
    mask: torch.Tensor | None  # [B, 1, max_q, K] bool; None means plain causal over one sequence
    # the mask of windowed layers, [B, 1, max_q, K] bool; None when no query reaches past the window
    window_mask: torch.Tensor | None = None


@dataclass(frozen=True, slots=True)
class PagedBatch:
    """Every sequence of the step, for the Triton kernel (CUDA): rows packed sequence by sequence,
    K/V read through the block tables in place, prefill chunks and decode rows alike."""

    block_tables: torch.Tensor  # [B, W] int32, padded with the null block 0
    cu_q: torch.Tensor  # [B + 1] int32: sequence b's rows are [cu_q[b], cu_q[b + 1])
    context_lens: torch.Tensor  # [B] int32, keys per sequence including its new tokens
    max_q: int  # most rows of any sequence (sizes the kernel's grid)


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    slots: tuple[torch.Tensor, torch.Tensor]  # (block ids, offsets), each [T]: where K/V go
    short: ShortBatch | None
    long: LongBatch | None
    scale: float
    paged: PagedBatch | None = None  # the Triton path: set instead of short and long
    # KV groups 1.. (model/kv_groups.py): the same step through each group's own block tables
    # (slots and tables differ, everything else is shared); empty with one group
    groups: tuple[AttentionMetadata, ...] = ()

    def group(self, g: int) -> AttentionMetadata:
        """The metadata of KV group g's layers."""
        return self if g == 0 else self.groups[g - 1]


class AttentionLayer(Protocol):
    """What LlamaModel calls: PagedAttention (CPU kernel / SDPA) or TritonAttention (CUDA)."""

    def __call__(
        self, layer: int, qkv: torch.Tensor, meta: AttentionMetadata, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        """qkv: [T, (H + 2 H_kv) D] after RoPE, this step's K/V already in the cache -> [T, H, D].
        sinks: [H] float32, the layer's attention sinks, or None."""


class PagedAttention:
    def __init__(
        self,
        cache: KVCache,
        kernels: NativeKernels | None,
        heads: tuple[int, int, int],
        windows: tuple[int, ...] = (),
        softcap: float | None = None,
    ):
        """windows: per layer, the keys a query sees (0: all); empty: no windows. softcap: Gemma 2's."""
        self.cache = cache
        self.kernels = kernels
        self.heads = heads  # (num_heads, num_kv_heads, head_dim)
        self.windows = windows
        self.softcap = softcap or 0.0

    def __call__(
        self, layer: int, qkv: torch.Tensor, meta: AttentionMetadata, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        """qkv: [T, (H + 2 H_kv) D] after RoPE, this step's K/V already in the cache -> [T, H, D].
        sinks: [H] float32, the layer's attention sinks, or None."""
        nh, nkv, d = self.heads
        T = qkv.shape[0]
        q = qkv[:, : nh * d].view(T, nh, d)  # strided views: no copies
        k = qkv[:, nh * d : (nh + nkv) * d].view(T, nkv, d)
        v = qkv[:, (nh + nkv) * d :].view(T, nkv, d)
        out = q.new_empty(T, nh, d)
        n_short = 0
        if meta.short is not None:
            if self.kernels is None:  # the runner makes short batches only when the kernel loaded
                raise RuntimeError("a short batch needs the native paged-attention kernel")
            n_short = meta.short.num_tokens
            s = meta.short
            self.kernels.paged_attention(
                PagedAttentionArgs(
                    q[:n_short],
                    self.cache.k_of(layer),
                    self.cache.v_of(layer),
                    s.block_tables,
                    s.cu_q,
                    s.context_lens,
                    out[:n_short],
                    meta.scale,
                    self._window(layer),
                    self.softcap,
                    sinks,
                )
            )
        if meta.long is not None:
            out[n_short:] = self._long(layer, q[n_short:], k[n_short:], v[n_short:], meta.long, meta.scale, sinks)
        return out

    def _window(self, layer: int) -> int:
        return self.windows[layer] if self.windows else 0

    def _long(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        lb: LongBatch,
        scale: float,
        sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        mask = lb.window_mask if self._window(layer) and lb.window_mask is not None else lb.mask
        if lb.fresh:
            # the keys and values as the cache holds them (a float16 cache under float32
            # activations rounds them): a prompt's numbers are the same whether its context comes
            # from this step's rows or from the cache (_gather)
            k, v = self._as_cached(k), self._as_cached(v)
        if lb.num_seqs == 1 and lb.fresh:
            # One fresh prompt: causal attention over its own tokens, no padding, no gather.
            o = self._sdpa(
                q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask, scale, sinks
            )
            return o[0].transpose(0, 1)
        qp = self._pad(q, lb)  # [B, H, max_q, D]
        if lb.fresh:
            kp, vp = self._pad(k, lb), self._pad(v, lb)
        else:
            if lb.block_tables is None:  # the runner builds them whenever a sequence has cached context
                raise RuntimeError("a long batch with cached context has no block tables")
            kp, vp = self._gather(layer, lb.block_tables, q.dtype)
        o = self._sdpa(qp, kp, vp, mask, scale, sinks)
        if lb.row_seq is None:
            return o[0].transpose(0, 1)
        return o.transpose(1, 2)[lb.row_seq, lb.row_pos]

    def _sdpa(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        scale: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [B, H, Q, D]; k, v: [B, H_kv, K, D]; mask: [B, 1, Q, K] bool (True: attend) or None
        for causal over Q == K; sinks: [H] or None -> [B, H, Q, D]."""
        if not self.softcap and sinks is None:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
            )
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        s = torch.matmul(q, k.transpose(2, 3)) * scale  # [B, H, Q, K], as transformers' eager attention
        if self.softcap:
            s = torch.tanh(s / self.softcap) * self.softcap
        if mask is None:
            mask = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
        if sinks is None:
            return torch.matmul(torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype), v)
        # the sink as one more column of scores [B, H, Q, K + 1], its probability then dropped
        sink = sinks.to(s.dtype).view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
        return torch.matmul(p.to(q.dtype), v)

    @staticmethod
    def _pad(x: torch.Tensor, lb: LongBatch) -> torch.Tensor:
        """[T, H, D] packed rows -> [B, H, max_q, D] (padding rows are zero)."""
        if lb.row_seq is None:
            return x.transpose(0, 1)[None]
        out = x.new_zeros(lb.num_seqs, lb.max_q, *x.shape[1:])
        out[lb.row_seq, lb.row_pos] = x
        return out.transpose(1, 2)

    def _as_cached(self, x: torch.Tensor) -> torch.Tensor:
        cached = self.cache.k.dtype
        return x if x.dtype == cached else x.to(cached).to(x.dtype)

    def _gather(self, layer: int, tables: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Context K/V of each sequence through its block table -> [B, H_kv, blocks * bs, D] in dtype."""
        B, nblk = tables.shape
        k = self.cache.k_of(layer)[tables]  # [B, nblk, H_kv, D, bs]
        v = self.cache.v_of(layer)[tables]  # [B, nblk, H_kv, bs, D]
        H, D, bs = k.shape[2], k.shape[3], k.shape[4]
        k = k.permute(0, 2, 1, 4, 3).reshape(B, H, nblk * bs, D).to(dtype)
        v = v.permute(0, 2, 1, 3, 4).reshape(B, H, nblk * bs, D).to(dtype)
        return k, v
