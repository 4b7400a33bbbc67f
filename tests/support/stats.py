"""Pearson's chi-square goodness-of-fit test, without scipy."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def _upper_regularized_gamma(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a), by the series for P below a + 1, else a continued
    fraction (Numerical Recipes, gser/gcf)."""
    if x <= 0:
        return 1.0
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return 1.0 - total * math.exp(log_prefix)
    tiny = 1e-300
    b, c, d = x + 1 - a, 1 / tiny, 1 / (x + 1 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_prefix) * h


def chi_square_p(counts: Mapping[object, int], weights: Mapping[object, float]) -> float:
    """p-value that `counts` were drawn with probabilities proportional to `weights`."""
    total, weight_sum = sum(counts.values()), sum(weights.values())
    stat = 0.0
    for key, weight in weights.items():
        expected = total * weight / weight_sum
        stat += (counts.get(key, 0) - expected) ** 2 / expected
    if set(counts) - set(weights):
        return 0.0  # something was drawn that should never be
    return _upper_regularized_gamma((len(weights) - 1) / 2, stat / 2)


def shares(values: Sequence[object]) -> dict[object, int]:
    out: dict[object, int] = {}
    for value in values:
        out[value] = out.get(value, 0) + 1
    return out
