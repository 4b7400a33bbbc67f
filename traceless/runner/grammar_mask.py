"""Structured outputs in the batched sampler: each guided row's logits outside its grammar's
allowed tokens become -inf before penalties, logprobs and sampling.

A sequence that verifies drafts owns 1 + d logit rows; row j scores the token after draft j, so
its mask is the grammar's state after drafts 1..j. The matcher consumes the drafts one by one
(computing each row's mask on the way) and is rolled back afterwards: the engine advances it with
the tokens it actually accepts. Rows past a draft the grammar refuses keep their logits: that
draft is rejected (its masked probability is 0), so nothing reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from traceless.structured.grammar import Guide


@dataclass(frozen=True, slots=True)
class GuidedSeq:
    first_row: int  # the sequence's first logit row
    guide: Guide
    draft_ids: list[int]  # the drafts this step verifies ([] when none)


def apply_grammar_masks(logits: torch.Tensor, seqs: list[GuidedSeq]) -> None:
    """logits [R, V] (in place): -inf outside each guided row's allowed tokens."""
    R, V = logits.shape
    words = (V + 31) // 32
    rows: list[int] = []
    n_rows = sum(1 + len(s.draft_ids) for s in seqs)
    bitmask = torch.zeros(n_rows, words, dtype=torch.int32)  # [G, W] bit t % 32 of word t // 32
    k = 0
    for s in seqs:
        consumed = 0
        for j in range(len(s.draft_ids) + 1):
            row = bitmask[k]
            s.guide.fill_mask(row.data_ptr(), words * 4)
            rows.append(s.first_row + j)
            k += 1
            if j == len(s.draft_ids) or s.guide.advance([s.draft_ids[j]]) != 1:
                break
            consumed += 1
        s.guide.rollback(consumed)
    bitmask = bitmask[:k]
    # little-endian int32 words: byte b holds tokens 8b .. 8b+7, lowest bit first
    allowed = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :V]
    blocked = torch.from_numpy(allowed == 0).to(logits.device)
    if rows == list(range(rows[0], rows[0] + len(rows))):  # the usual case: in place on a view, no copies
        logits[rows[0] : rows[0] + len(rows)].masked_fill_(blocked, float("-inf"))
        wipe = [blocked, bitmask]
    else:
        index = torch.tensor(rows, dtype=torch.long, device=logits.device)
        guided = logits.index_select(0, index).masked_fill_(blocked, float("-inf"))
        logits.index_copy_(0, index, guided)
        wipe = [guided, blocked, bitmask]
    # the masks say what the request's grammar allows next, the copies are its logits: wipe them
    for t in wipe:
        t.zero_()
    allowed.fill(0)
