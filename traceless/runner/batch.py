"""Pack one forward pass: sequences' new tokens -> token ids, positions, cache slots, attention
metadata, and the rows that need logits.

Rows are packed short-first (see attention.py): sequences with at most SHORT_MAX_TOKENS new tokens
(decode, speculative verification, chunks and prompts of up to 128 tokens) go to the native
kernel, the rest to SDPA.
Logit rows come in packed order: `order` lists the sequences (indices into the input) that way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from traceless.model.layers.attention import AttentionMetadata, LongBatch, PagedBatch, ShortBatch
from traceless.runner.step_meta import Layout, PinnedStaging

# Sequences with at most this many new tokens go to the native kernel (decode, speculative
# verification, chunks and prompts of up to 128 tokens). Each of its query rows is computed alone
# from the cache, so a prompt this short has the same numbers however the scheduler cut it (the cut
# depends on the other requests: tests/model/test_quantized_batch_invariance.py). At 128 the rows
# also beat SDPA's padded batch: a prefill step of 16 x 128-token prompts spent 7.5 ms a layer in
# SDPA with its padding and gathers, 3.9 ms in the native rows (AVX-512 EPYC, float16 cache). Longer
# prompts stay on SDPA, ahead there: one 1024-token prompt 11.2 ms a layer against the rows' 17.7.
SHORT_MAX_TOKENS = 128


@dataclass(frozen=True, slots=True)
class SeqInput:
    """One sequence's part of a pass: token_ids at positions [start, start + len), K/V through
    `table`; the last num_logits of its rows need logits."""

    table: list[int]
    start: int
    token_ids: list[int]
    num_logits: int
    rope_shift: int = 0  # added to the positions to index the RoPE table (LongRoPE: model/rope.py)
    group_tables: tuple[list[int], ...] = ()  # the block tables of KV groups 1.. (model/kv_groups.py)


@dataclass(frozen=True, slots=True)
class PackedBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    logit_rows: torch.Tensor  # [R] packed row of each logit row, sequence by sequence in `order`
    order: list[int]  # input indices of the sequences in packed order


class BatchBuilder:
    def __init__(
        self,
        block_size: int,
        device: torch.device,
        use_native: bool,
        scale: float,
        paged: bool = False,
        window: int = 0,
    ):
        """paged: the Triton attention path (CUDA): every sequence in one PagedBatch, the step's
        metadata in one pinned buffer and one host-to-device copy. window: the model's sliding
        window (0: none), for the masks of its windowed layers."""
        self.window = window
        self.block_size = block_size
        self.device = device
        self.use_native = use_native
        self.scale = scale
        self.paged = paged
        self._staging = PinnedStaging(pinned=device.type == "cuda") if paged else None

    def is_short(self, num_tokens: int) -> bool:
        return self.use_native and num_tokens <= SHORT_MAX_TOKENS

    def build(self, seqs: Sequence[SeqInput]) -> PackedBatch:
        if self._staging is not None:
            return self._build_paged(seqs, self._staging)
        order = sorted(range(len(seqs)), key=lambda i: not self.is_short(len(seqs[i].token_ids)))  # stable
        n_short = sum(1 for i in order if self.is_short(len(seqs[i].token_ids)))
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slot_blocks: list[int] = []
        slot_offsets: list[int] = []
        logit_rows: list[int] = []
        for i in order:
            s = seqs[i]
            ids.extend(s.token_ids)
            logit_rows.extend(range(len(ids) - s.num_logits, len(ids)))
            pos = range(s.start, s.start + len(s.token_ids))
            positions.extend(range(s.start + s.rope_shift, s.start + s.rope_shift + len(s.token_ids)))
            slot_blocks.extend(s.table[p // bs] for p in pos)
            slot_offsets.extend(p % bs for p in pos)
        short, long = [seqs[i] for i in order[:n_short]], [seqs[i] for i in order[n_short:]]
        dev = self.device
        meta = AttentionMetadata(
            slots=(torch.tensor(slot_blocks, device=dev), torch.tensor(slot_offsets, device=dev)),
            short=self._short_batch(short) if short else None,
            long=self._long_batch(long) if long else None,
            scale=self.scale,
        )
        if seqs[0].group_tables:
            meta = replace(
                meta,
                groups=tuple(
                    self._group_meta(meta, [seqs[i] for i in order], g, n_short)
                    for g in range(len(seqs[0].group_tables))
                ),
            )
        return PackedBatch(
            torch.tensor(ids, device=dev),
            torch.tensor(positions, device=dev),
            meta,
            torch.tensor(logit_rows, dtype=torch.long, device=dev),
            order,
        )

    def _group_meta(self, meta: AttentionMetadata, packed: list[SeqInput], g: int, n_short: int) -> AttentionMetadata:
        """Group g + 1's metadata: meta's, with that group's cache slots and block tables."""
        bs = self.block_size
        tables = [s.group_tables[g] for s in packed]
        blocks = [t[p // bs] for s, t in zip(packed, tables) for p in range(s.start, s.start + len(s.token_ids))]
        short, long = meta.short, meta.long
        if short is not None:
            widths = [-(-(s.start + len(s.token_ids)) // bs) for s in packed[:n_short]]
            short = replace(short, block_tables=_pad_tables(tables[:n_short], widths, torch.int32, self.device))
        if long is not None and long.block_tables is not None:
            widths = [-(-(s.start + len(s.token_ids)) // bs) for s in packed[n_short:]]
            long = replace(long, block_tables=_pad_tables(tables[n_short:], widths, torch.long, self.device))
        return replace(meta, slots=(torch.tensor(blocks, device=self.device), meta.slots[1]), short=short, long=long)

    def _build_paged(self, seqs: Sequence[SeqInput], staging: PinnedStaging) -> PackedBatch:
        """Rows in input order; one upload of ids, positions, slots, logit rows and tables."""
        bs = self.block_size
        width = max(-(-(s.start + len(s.token_ids)) // bs) for s in seqs)
        layout = Layout(
            rows=sum(len(s.token_ids) for s in seqs),
            logits=sum(s.num_logits for s in seqs),
            seqs=len(seqs),
            width=width,
            groups=1 + len(seqs[0].group_tables),
        )
        v = layout.views(staging.upload(layout, seqs, bs, self.device))
        meta = paged_meta(v, layout.groups, len(seqs), max(len(s.token_ids) for s in seqs), self.scale)
        return PackedBatch(v["ids"], v["positions"], meta, v["logit_rows"], list(range(len(seqs))))

    def scrub(self) -> None:
        """Zero the host staging of the step's token ids (the CUDA path's pinned buffer)."""
        if self._staging is not None:
            self._staging.scrub()

    def _short_batch(self, seqs: list[SeqInput]) -> ShortBatch:
        cu = [0]
        for s in seqs:
            cu.append(cu[-1] + len(s.token_ids))
        ctx = [s.start + len(s.token_ids) for s in seqs]
        return ShortBatch(
            num_tokens=cu[-1],
            block_tables=_pad_tables(
                [s.table for s in seqs], [-(-x // self.block_size) for x in ctx], torch.int32, self.device
            ),
            cu_q=torch.tensor(cu, dtype=torch.int32, device=self.device),
            context_lens=torch.tensor(ctx, dtype=torch.int32, device=self.device),
        )

    def _long_batch(self, seqs: list[SeqInput]) -> LongBatch:
        dev = self.device
        q_lens = [len(s.token_ids) for s in seqs]
        starts = [s.start for s in seqs]
        B, max_q = len(seqs), max(q_lens)
        fresh = not any(starts)
        if B == 1 and fresh:
            window_mask = None
            if self.window and max_q > self.window:
                i, j = torch.arange(max_q, device=dev)[:, None], torch.arange(max_q, device=dev)[None, :]
                window_mask = ((j <= i) & (j > i - self.window))[None, None]
            return LongBatch(1, max_q, True, None, None, None, None, window_mask)
        row_seq = torch.repeat_interleave(torch.arange(B, device=dev), torch.tensor(q_lens, device=dev))
        row_pos = torch.cat([torch.arange(n, device=dev) for n in q_lens])
        block_tables = None
        if fresh:
            num_keys = max_q
        else:
            n_blocks = [-(-(s + n) // self.block_size) for s, n in zip(starts, q_lens)]
            block_tables = _pad_tables([s.table for s in seqs], n_blocks, torch.long, dev)
            num_keys = block_tables.shape[1] * self.block_size
        # Query row i of sequence b sits at position start_b + i and sees keys [0, start_b + i].
        i = torch.arange(max_q, device=dev)[None, :, None]
        j = torch.arange(num_keys, device=dev)[None, None, :]
        start = torch.tensor(starts, device=dev)[:, None, None]
        q_len = torch.tensor(q_lens, device=dev)[:, None, None]
        allowed = j <= start + i
        padding = i >= q_len
        mask = (allowed & ~padding) | (padding & (j == 0))  # padding rows see one key: no NaN rows
        window_mask = None
        if self.window and max(s + n for s, n in zip(starts, q_lens)) > self.window:
            # windowed layers: query at position p sees keys (p - W, p]; padding rows key 0 again
            window_mask = ((allowed & (j > start + i - self.window)) & ~padding) | (padding & (j == 0))
            window_mask = window_mask[:, None]
        return LongBatch(B, max_q, fresh, block_tables, row_seq, row_pos, mask[:, None], window_mask)


def paged_meta(
    v: dict[str, torch.Tensor], groups: int, num_seqs: int, max_q: int, scale: float, rows: int | None = None
) -> AttentionMetadata:
    """The Triton path's metadata over a packed buffer's views (step_meta.py), every KV group's;
    rows: only the first rows (a captured decode batch of that size), else every row."""
    n = num_seqs

    def group(g: int) -> AttentionMetadata:
        blocks, tables = v["blocks" if g == 0 else f"blocks{g}"], v["tables" if g == 0 else f"tables{g}"]
        paged = PagedBatch(tables[:n], v["cu_q"][: n + 1], v["ctx"][:n], max_q)
        return AttentionMetadata(
            slots=(blocks[:rows], v["offsets"][:rows]), short=None, long=None, scale=scale, paged=paged
        )

    return replace(group(0), groups=tuple(group(g) for g in range(1, groups)))


def _pad_tables(tables: list[list[int]], lengths: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Block tables cut to each sequence's blocks and padded with the null block 0."""
    width = max(lengths)
    rows = [t[:n] + [0] * (width - n) for t, n in zip(tables, lengths)]
    return torch.tensor(rows, dtype=dtype, device=device)
