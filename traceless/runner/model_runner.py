"""One engine step on the model: build the packed batch, run one forward, sample.

    step():  chunks -> batcher.build() -> model.forward() -> logits of finishing rows -> sampler

Rows are packed short-first (see batch.py). Only rows that complete their sequence (the
last token of a prefill, or a decode token) get logits and a sample.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from traceless.engine.request import Request
from traceless.engine.scheduler import ScheduledChunk
from traceless.model.llama import LlamaModel
from traceless.runner.batch import BatchBuilder, SeqInput
from traceless.runner.sampler import Sampler, SampleRow, TokenLogprobs


@dataclass(frozen=True, slots=True)
class Sampled:
    token_id: int
    logprobs: TokenLogprobs | None


class ModelRunner:
    def __init__(self, model: LlamaModel, block_size: int, device: torch.device, use_native: bool, seed: int | None = None):
        self.model = model
        self.block_size = block_size
        self.device = device
        self.use_native = use_native
        self.batcher = BatchBuilder(block_size, device, use_native, model.config.head_dim ** -0.5)
        self.sampler = Sampler(device, seed)
        self._generators: dict[str, torch.Generator] = {}

    def step(self, chunks: Sequence[ScheduledChunk], block_ids: Callable[[str], list[int]]) -> dict[str, Sampled]:
        with torch.inference_mode():
            seqs = [_seq_input(c, block_ids(c.request.request_id)) for c in chunks]
            batch = self.batcher.build(seqs)
            hidden = self.model.forward(batch.input_ids, batch.positions, batch.meta)
            sampled = [chunks[i].request for i in batch.order if seqs[i].num_logits]
            if not sampled:
                return {}
            logits = self.model.logits(hidden[batch.logit_rows])
            out = self.sampler(logits, [self._sample_row(r) for r in sampled])
            logits.zero_()  # derived from user content: wipe before the allocator reuses it
        return {r.request_id: Sampled(t, lp) for r, t, lp in zip(sampled, out.token_ids, out.logprobs)}

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def num_held(self) -> int:
        return len(self._generators)

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


def _seq_input(chunk: ScheduledChunk, table: list[int]) -> SeqInput:
    req, start, n = chunk.request, chunk.request.num_computed_tokens, chunk.num_new_tokens
    return SeqInput(table, start, req.token_ids(start, start + n), 1 if chunk.completes_sequence else 0)
