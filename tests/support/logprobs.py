"""Tie-tolerant comparisons of logprobs and ranks against a reference.

Two machines (AVX-512 with bfloat16, AVX2 only) and two implementations (our native kernels,
transformers) differ in the last bits of every matmul, so tokens whose logits are closer than those
bits can swap ranks. A test states a tolerance `eps` on logprobs and accepts any rank inside the band
of reference values within `eps` of the token's own.
"""

from __future__ import annotations

import torch

EPS = 1e-4  # the logprob tolerance the parity tests use; two values each within EPS may swap


def rank_band(row: torch.Tensor, token: int, eps: float = EPS) -> range:
    """Ranks (1-based) `token` may have in `row` ([V] reference logprobs) when values closer than
    2 * eps to its own may be ordered either way."""
    v = float(row[token])
    first = int((row > v + 2 * eps).sum()) + 1
    last = int((row >= v - 2 * eps).sum())
    return range(first, last + 1)


def assert_rank(rank: int, row: torch.Tensor, token: int, eps: float = EPS) -> None:
    band = rank_band(row, token, eps)
    assert rank in band, f"rank {rank} outside the reference's tie band {band.start}..{band.stop - 1}"


def assert_top(got_ids: list[int], got_values: list[float], row: torch.Tensor, eps: float = EPS) -> None:
    """`got_ids` (with their logprobs `got_values`, best first) are a valid top-len(got_ids) of `row`:
    each value equals the reference's, the order is descending up to ties, and no token left out
    beats one taken by more than the tolerance."""
    n = len(got_ids)
    assert len(set(got_ids)) == n
    for tid, value in zip(got_ids, got_values):
        assert abs(value - float(row[tid])) < eps
    assert all(a >= b - 2 * eps for a, b in zip(got_values, got_values[1:]))
    if n:
        nth = float(row.topk(n).values[-1])  # the reference's n-th best value
        assert min(float(row[t]) for t in got_ids) >= nth - 2 * eps


def assert_argmax(token: int, row: torch.Tensor, eps: float = EPS) -> None:
    """`token` is a greedy choice of `row` up to ties within the tolerance."""
    assert float(row[token]) >= float(row.max()) - 2 * eps


def assert_same_logprobs(a: dict, b: dict, eps: float = EPS) -> None:
    """Two {token: Logprob(logprob, rank)} entries of our own engine computed in differently shaped
    batches (plain vs speculative): values equal within eps; a rank or a membership may differ only
    between tokens tied within the tolerance."""
    values = [v.logprob for v in (*a.values(), *b.values())]

    def tied(t: int, lp: float) -> bool:
        return sum(abs(lp - v) < 2 * eps for v in values) > (2 if t in a and t in b else 1)

    for t in a.keys() | b.keys():
        if t in a and t in b:
            assert abs(a[t].logprob - b[t].logprob) < eps
            assert a[t].rank == b[t].rank or tied(t, a[t].logprob)
        else:
            lp = (a.get(t) or b[t]).logprob
            assert tied(t, lp), "a token present in only one entry is not tied with another"
