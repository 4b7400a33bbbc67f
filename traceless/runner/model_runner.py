"""One engine step on the model: build the packed batch, run one forward, sample.

    step():  chunks -> _prepare() -> model.forward() -> logits of finishing rows -> sampler

Rows are packed short-first (see attention.py). Only rows that complete their sequence (the
last token of a prefill, or a decode token) get logits and a sample.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from traceless.engine.request import Request
from traceless.engine.scheduler import ScheduledChunk
from traceless.model.llama import LlamaModel
from traceless.runner.attention import AttentionMetadata, LongBatch, ShortBatch
from traceless.runner.sampler import Sampler, SampleRow, TokenLogprobs

# Sequences with at most this many new tokens go to the native kernel (decode, small chunks).
SHORT_MAX_TOKENS = 8


@dataclass(frozen=True, slots=True)
class Sampled:
    token_id: int
    logprobs: TokenLogprobs | None


@dataclass(frozen=True, slots=True)
class _Batch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] row index of each sampled sequence
    sampled: list[Request]


class ModelRunner:
    def __init__(self, model: LlamaModel, block_size: int, device: torch.device, use_native: bool, seed: int | None = None):
        self.model = model
        self.block_size = block_size
        self.device = device
        self.use_native = use_native
        self.sampler = Sampler(device, seed)
        self._generators: dict[str, torch.Generator] = {}

    def step(self, chunks: Sequence[ScheduledChunk], block_ids: Callable[[str], list[int]]) -> dict[str, Sampled]:
        with torch.inference_mode():
            batch = self._prepare(chunks, block_ids)
            hidden = self.model.forward(batch.input_ids, batch.positions, batch.meta)
            if not batch.sampled:
                return {}
            logits = self.model.logits(hidden[batch.sample_rows])
            out = self.sampler(logits, [self._sample_row(r) for r in batch.sampled])
            logits.zero_()  # derived from user content: wipe before the allocator reuses it
        return {r.request_id: Sampled(t, lp) for r, t, lp in zip(batch.sampled, out.token_ids, out.logprobs)}

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def num_held(self) -> int:
        return len(self._generators)

    # --- batch construction -----------------------------------------------------------------
    def _prepare(self, chunks: Sequence[ScheduledChunk], block_ids: Callable[[str], list[int]]) -> _Batch:
        short = [c for c in chunks if self.use_native and c.num_new_tokens <= SHORT_MAX_TOKENS]
        long = [c for c in chunks if not (self.use_native and c.num_new_tokens <= SHORT_MAX_TOKENS)]
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slot_blocks: list[int] = []
        slot_offsets: list[int] = []
        sample_rows: list[int] = []
        sampled: list[Request] = []
        tables: list[list[int]] = []
        for c in (*short, *long):
            req, start, n = c.request, c.request.num_computed_tokens, c.num_new_tokens
            table = block_ids(req.request_id)
            tables.append(table)
            ids.extend(req.token_ids(start, start + n))
            pos = range(start, start + n)
            positions.extend(pos)
            slot_blocks.extend(table[p // bs] for p in pos)
            slot_offsets.extend(p % bs for p in pos)
            if c.completes_sequence:
                sample_rows.append(len(ids) - 1)
                sampled.append(req)
        dev = self.device
        meta = AttentionMetadata(
            slots=(torch.tensor(slot_blocks, device=dev), torch.tensor(slot_offsets, device=dev)),
            short=self._short_batch(short, tables[: len(short)]) if short else None,
            long=self._long_batch(long, tables[len(short):]) if long else None,
            scale=self.model.config.head_dim ** -0.5,
        )
        return _Batch(torch.tensor(ids, device=dev), torch.tensor(positions, device=dev), meta,
                      torch.tensor(sample_rows, device=dev), sampled)

    def _short_batch(self, chunks: list[ScheduledChunk], tables: list[list[int]]) -> ShortBatch:
        q_lens = [c.num_new_tokens for c in chunks]
        cu = [0]
        for n in q_lens:
            cu.append(cu[-1] + n)
        ctx = [c.request.num_computed_tokens + c.num_new_tokens for c in chunks]
        return ShortBatch(
            num_tokens=cu[-1],
            block_tables=_pad_tables(tables, [-(-x // self.block_size) for x in ctx], torch.int32, self.device),
            cu_q=torch.tensor(cu, dtype=torch.int32, device=self.device),
            context_lens=torch.tensor(ctx, dtype=torch.int32, device=self.device),
        )

    def _long_batch(self, chunks: list[ScheduledChunk], tables: list[list[int]]) -> LongBatch:
        dev = self.device
        q_lens = [c.num_new_tokens for c in chunks]
        starts = [c.request.num_computed_tokens for c in chunks]
        B, max_q = len(chunks), max(q_lens)
        fresh = not any(starts)
        if B == 1 and fresh:
            return LongBatch(1, max_q, True, None, None, None, None)
        row_seq = torch.repeat_interleave(torch.arange(B, device=dev), torch.tensor(q_lens, device=dev))
        row_pos = torch.cat([torch.arange(n, device=dev) for n in q_lens])
        block_tables = None
        if fresh:
            num_keys = max_q
        else:
            n_blocks = [-(-(s + n) // self.block_size) for s, n in zip(starts, q_lens)]
            block_tables = _pad_tables(tables, n_blocks, torch.long, dev)
            num_keys = block_tables.shape[1] * self.block_size
        # Query row i of sequence b sits at position start_b + i and sees keys [0, start_b + i].
        i = torch.arange(max_q, device=dev)[None, :, None]
        j = torch.arange(num_keys, device=dev)[None, None, :]
        start = torch.tensor(starts, device=dev)[:, None, None]
        q_len = torch.tensor(q_lens, device=dev)[:, None, None]
        allowed = j <= start + i
        padding = i >= q_len
        allowed = (allowed & ~padding) | (padding & (j == 0))  # padding rows see one key: no NaN rows
        return LongBatch(B, max_q, fresh, block_tables, row_seq, row_pos, allowed[:, None])

    def _sample_row(self, req: Request) -> SampleRow:
        p = req.params
        gen = None
        if p.seed is not None and not p.greedy:
            gen = self._generators.get(req.request_id)
            if gen is None:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(p.seed % 2**64)
                self._generators[req.request_id] = gen
        needs_out = p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0
        return SampleRow(
            params=p,
            generator=gen,
            prompt_ids=req.prompt_token_ids() if p.repetition_penalty != 1.0 else None,
            output_ids=req.output_token_ids() if needs_out else None,
        )


def _pad_tables(tables: list[list[int]], lengths: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Block tables cut to each sequence's blocks and padded with the null block 0."""
    width = max(lengths)
    rows = [t[:n] + [0] * (width - n) for t, n in zip(tables, lengths)]
    return torch.tensor(rows, dtype=dtype, device=device)
