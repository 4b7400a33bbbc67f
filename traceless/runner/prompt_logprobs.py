"""Prompt logprobs: the raw model's log-probability of each prompt token given the tokens before it.

The row at prompt position k predicts token k + 1, so a prefill chunk covering positions
[s, e) scores prompt tokens s + 1 .. e (the scheduler hands the runner those targets). Logits of
every such row are needed, not only the last one: they are computed in slices of SLICE_ROWS rows
so that a long chunk never holds [chunk, vocab] floats at once, and every slice is zeroed before
it is dropped (the logits are derived from user content).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from traceless.engine.step_io import TokenLogprobs

SLICE_ROWS = 256


def score_prompt(
    logits_of: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: list[int], top_n: int
) -> list[TokenLogprobs]:
    """hidden [T, H]: the rows whose next tokens are `targets` (len T); top_n alternatives per row.
    logits_of: [S, H] -> [S, V] float32."""
    out: list[TokenLogprobs] = []
    for lo in range(0, len(targets), SLICE_ROWS):
        hi = min(lo + SLICE_ROWS, len(targets))
        logits = logits_of(hidden[lo:hi])  # [S, V]
        lp = torch.log_softmax(logits, dim=-1)
        target = torch.tensor(targets[lo:hi], dtype=torch.long, device=lp.device)
        chosen = lp.gather(1, target[:, None])  # [S, 1]
        ranks = ((lp > chosen).sum(dim=-1) + 1).tolist()
        values = chosen[:, 0].tolist()
        top_vals, top_idx = lp.topk(max(top_n, 1), dim=-1)
        top_ids, top_lps = top_idx[:, :top_n].tolist(), top_vals[:, :top_n].tolist()
        out.extend(TokenLogprobs(v, r, i, t) for v, r, i, t in zip(values, ranks, top_ids, top_lps))
        for t in (logits, lp, chosen, target, top_vals, top_idx):
            t.zero_()
    return out
