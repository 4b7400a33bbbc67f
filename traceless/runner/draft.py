"""Self-speculation: the model's own first layers propose draft tokens.

The draft model is layers [0, num_layers) of the target, then the target's final norm and lm_head.
Because those layers *are* the target's first layers, the K/V the target wrote for earlier
positions is exactly what the draft would have computed: the draft reads the paged cache as is.

For a request whose last sampled token t sits at position c (= num_computed_tokens), with d drafts:

    draft step j = 0 .. d-1:  feed t (j = 0) or x_j at position c + j  ->  x_{j+1}
                              (K/V of the first layers go to slot c + j)
    verification (full model): feeds [t, x_1 .. x_d] at positions c .. c + d and overwrites
                              every slot the draft wrote.

All speculating requests run each draft step together (one forward per step, no per-request loop
in the layers). A greedy request drafts the argmax; a sampled one draws from q (its own sampling
processing applied to the draft logits) with its own generator, and q is kept for the rejection rule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from traceless.model.llama import LlamaModel
from traceless.runner.batch import BatchBuilder, SeqInput
from traceless.runner.sampler import Sampler, SampleRow


@dataclass(frozen=True, slots=True)
class DraftSeq:
    table: list[int]  # block ids (slots for positions c .. c + num_drafts are allocated)
    start: int  # c: position of the last sampled token
    last_token: int
    num_drafts: int
    row: SampleRow  # sampling state before this step
    rope_shift: int = 0  # see SeqInput
    group_tables: tuple[list[int], ...] = ()  # see SeqInput


@dataclass(frozen=True, slots=True)
class Drafted:
    token_ids: list[int]
    probs: torch.Tensor | None  # [d, V] q of each draft (sampled requests); None: greedy drafts


class DraftProposer:
    def __init__(self, model: LlamaModel, num_layers: int, batcher: BatchBuilder, sampler: Sampler):
        if not 1 <= num_layers < len(model.layers):
            raise ValueError(f"draft_layers must be between 1 and {len(model.layers) - 1} for this model")
        self.model = model
        self.num_layers = num_layers
        self.batcher = batcher
        self.sampler = sampler  # penalties and filters shared with the target's sampling

    def propose(self, seqs: list[DraftSeq]) -> list[Drafted]:
        tokens: list[list[int]] = [[] for _ in seqs]
        probs: list[list[torch.Tensor]] = [[] for _ in seqs]
        for j in range(max(s.num_drafts for s in seqs)):
            active = [i for i, s in enumerate(seqs) if s.num_drafts > j]
            inputs = [
                SeqInput(
                    seqs[i].table,
                    seqs[i].start + j,
                    [tokens[i][-1] if j else seqs[i].last_token],
                    1,
                    seqs[i].rope_shift,
                    seqs[i].group_tables,
                )
                for i in active
            ]
            batch = self.batcher.build(inputs)
            hidden = self.model.forward(batch.input_ids, batch.positions, batch.meta, num_layers=self.num_layers)
            active = [active[k] for k in batch.order]
            rows = [_with_drafts(seqs[i].row, tokens[i]) for i in active]
            logits = self.model.logits(hidden[batch.logit_rows])  # [A, V]
            new, q = self._sample(logits, rows)
            logits.zero_()
            for k, i in enumerate(active):
                tokens[i].append(new[k])
                q_k = q[k]
                if q_k is not None:
                    probs[i].append(q_k)
        out = [Drafted(t, torch.stack(p) if p else None) for t, p in zip(tokens, probs)]
        for p in probs:  # views of each step's q, derived from user content: wipe
            for row in p:
                row.zero_()
        return out

    def _sample(self, logits: torch.Tensor, rows: list[SampleRow]) -> tuple[list[int], list[torch.Tensor | None]]:
        """Greedy rows: argmax of the penalized logits. Sampled rows: x ~ q, q kept ([V] each)."""
        self.sampler.penalize(logits, rows)
        ids = logits.argmax(dim=-1).tolist()
        q: list[torch.Tensor | None] = [None] * len(rows)
        sampled = [k for k, r in enumerate(rows) if not r.params.greedy]
        if not sampled:
            return ids, q
        dist = self.sampler.distribution(logits[sampled], [rows[k] for k in sampled])
        dist = dist / dist.sum(dim=-1, keepdim=True)
        shared = [n for n, k in enumerate(sampled) if rows[k].generator is None]
        draws: dict[int, int] = {}  # index in `sampled` -> drawn token id
        if shared:
            picks = torch.multinomial(dist[shared], 1, generator=self.sampler.generator)[:, 0].tolist()
            draws.update(zip(shared, picks))
        for n, k in enumerate(sampled):
            if rows[k].generator is not None:
                draws[n] = int(torch.multinomial(dist[n], 1, generator=rows[k].generator))
        for n, k in enumerate(sampled):
            ids[k], q[k] = draws[n], dist[n]
        return ids, q


def _with_drafts(row: SampleRow, drafts: list[int]) -> SampleRow:
    """Drafts made so far count as generated for the penalties of the next one."""
    if not drafts or row.output_ids is None:
        return row
    return replace(row, output_ids=row.output_ids + drafts)
