"""One engine step on the model: build the packed batch, run one forward, sample.

    step():  chunks -> [draft] -> batch.build() -> model.forward() -> logits of finishing rows
             -> sampler, or rejection sampler when the step verifies drafts

Only rows that complete their sequence (the last token of a prefill, or a decode token) get
logits; a speculating sequence gets them at all of its 1 + d positions. Drafts are the
request's own (prompt lookup, proposed by the engine) or, with a DraftProposer, made here by the
model's first layers just before the verifying forward.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from traceless.engine.request import Request
from traceless.engine.scheduler import ScheduledChunk
from traceless.model.llama import LlamaModel
from traceless.runner.batch import BatchBuilder, SeqInput
from traceless.runner.draft import DraftProposer, DraftSeq, Drafted
from traceless.runner.rejection import RejectionSampler, SpecRow
from traceless.runner.sampler import Sampler, SampleRow, TokenLogprobs


@dataclass(frozen=True, slots=True)
class Sampled:
    """What a step emits for one request: one token, or accepted drafts and one more."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None  # one per token, when the request asked for logprobs


class ModelRunner:
    def __init__(self, model: LlamaModel, block_size: int, device: torch.device, use_native: bool, seed: int | None = None,
                 draft_layers: int | None = None):
        """draft_layers: self-speculation depth when the engine runs speculative='draft'."""
        self.model = model
        self.block_size = block_size
        self.device = device
        self.use_native = use_native
        self.batcher = BatchBuilder(block_size, device, use_native, model.config.head_dim ** -0.5)
        self.sampler = Sampler(device, seed)
        self.rejection = RejectionSampler(self.sampler)
        self.drafter = DraftProposer(model, draft_layers, self.batcher, self.sampler) if draft_layers else None
        self._generators: dict[str, torch.Generator] = {}

    def step(self, chunks: Sequence[ScheduledChunk], block_ids: Callable[[str], list[int]]) -> dict[str, Sampled]:
        with torch.inference_mode():
            tables = [block_ids(c.request.request_id) for c in chunks]
            drafts = self._drafts(chunks, tables)
            seqs = [_seq_input(c, t, d) for c, t, d in zip(chunks, tables, drafts)]
            batch = self.batcher.build(seqs)
            hidden = self.model.forward(batch.input_ids, batch.positions, batch.meta)
            order = [i for i in batch.order if seqs[i].num_logits]
            if not order:
                return {}
            logits = self.model.logits(hidden[batch.logit_rows])  # [R, V]
            rows = [self._sample_row(chunks[i].request) for i in order]
            if any(d is not None for d in drafts):
                spec = [SpecRow(r, [], None) if drafts[i] is None else SpecRow(r, drafts[i].token_ids, drafts[i].probs)
                        for r, i in zip(rows, order)]
                results = [Sampled(v.token_ids, v.logprobs) for v in self.rejection(logits, spec)]
                for d in drafts:
                    if d is not None and d.probs is not None:
                        d.probs.zero_()
            else:
                out = self.sampler(logits, rows)
                results = [Sampled([t], None if lp is None else [lp]) for t, lp in zip(out.token_ids, out.logprobs)]
            logits.zero_()  # derived from user content: wipe before the allocator reuses it
        return {chunks[i].request.request_id: s for i, s in zip(order, results)}

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def num_held(self) -> int:
        return len(self._generators)

    def _drafts(self, chunks: Sequence[ScheduledChunk], tables: list[list[int]]) -> list[Drafted | None]:
        """Each chunk's drafts: the request's own, or made now by the draft model (None: no drafts)."""
        out: list[Drafted | None] = [None] * len(chunks)
        spec = [i for i, c in enumerate(chunks) if c.num_draft_tokens]
        if not spec:
            return out
        if self.drafter is None:
            for i in spec:
                c = chunks[i]
                out[i] = Drafted(list(c.request.draft_token_ids[: c.num_draft_tokens]), None)
            return out
        seqs = [DraftSeq(tables[i], chunks[i].request.num_computed_tokens, chunks[i].request.last_token_id,
                         chunks[i].num_draft_tokens, self._sample_row(chunks[i].request)) for i in spec]
        for i, d in zip(spec, self.drafter.propose(seqs)):
            out[i] = d
        return out

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


def _seq_input(chunk: ScheduledChunk, table: list[int], drafts: Drafted | None) -> SeqInput:
    """The chunk's tokens: known ones, then its drafts; logits at the last token and every draft."""
    req, start = chunk.request, chunk.request.num_computed_tokens
    n_known = chunk.num_new_tokens - chunk.num_draft_tokens
    ids = req.token_ids(start, start + n_known)
    if drafts is not None:
        ids += drafts.token_ids
    return SeqInput(table, start, ids, 1 + chunk.num_draft_tokens if chunk.completes_sequence else 0)
