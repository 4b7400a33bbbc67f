"""Small statistics for the audit tools (no SciPy dependency)."""

from __future__ import annotations

import math


def roc_auc(positives: list[float], negatives: list[float]) -> float:
    """P(score of a random positive > score of a random negative), ties counting one half
    (the Mann-Whitney U statistic divided by n_pos * n_neg)."""
    if not positives or not negatives:
        return float("nan")
    ranked = sorted([(s, 1) for s in positives] + [(s, 0) for s in negatives])
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        avg_rank = (i + 1 + j) / 2  # ranks i+1 .. j share their average
        rank_sum += avg_rank * sum(label for _, label in ranked[i:j])
        i = j
    n_pos, n_neg = len(positives), len(negatives)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def best_threshold_accuracy(positives: list[float], negatives: list[float]) -> tuple[float, float]:
    """(accuracy, threshold) of the best rule "score >= threshold means positive"."""
    n = len(positives) + len(negatives)
    best = (max(len(positives), len(negatives)) / n, float("inf"))
    # Sweep thresholds from low to high: at threshold t, positives >= t and negatives < t are right.
    events = sorted([(s, 1) for s in positives] + [(s, 0) for s in negatives])
    pos_below, neg_below, i = 0, 0, 0
    while i < len(events):
        t = events[i][0]
        correct = (len(positives) - pos_below) + neg_below
        best = max(best, (correct / n, t))
        while i < len(events) and events[i][0] == t:
            pos_below += events[i][1]
            neg_below += 1 - events[i][1]
            i += 1
    return best


def held_out_accuracy(positives: list[float], negatives: list[float]) -> float:
    """Leave-one-out accuracy of the threshold rule: each sample is classified by the best threshold
    chosen on all the others. Unlike the best in-sample threshold (which picks the luckiest of n
    cut points and reads well above chance on pure noise), this is what an attacker who tunes on
    past probes gets on the next one; on noise it sits at or below the majority-class rate."""
    samples = [(s, True) for s in positives] + [(s, False) for s in negatives]
    correct = 0
    for i, (score, label) in enumerate(samples):
        pos = [s for j, (s, lab) in enumerate(samples) if lab and j != i]
        neg = [s for j, (s, lab) in enumerate(samples) if not lab and j != i]
        _, t = best_threshold_accuracy(pos, neg)
        if t == float("inf"):  # no threshold beats guessing the majority class
            guess = len(pos) >= len(neg)
        else:
            guess = score >= t
        correct += guess == label
    return correct / len(samples) if samples else float("nan")


def roc_curve(positives: list[float], negatives: list[float]) -> tuple[list[float], list[float]]:
    """False- and true-positive rates over all thresholds (for plotting)."""
    fpr, tpr = [0.0], [0.0]
    for t in sorted(set(positives) | set(negatives), reverse=True):
        fpr.append(sum(s >= t for s in negatives) / len(negatives))
        tpr.append(sum(s >= t for s in positives) / len(positives))
    return fpr, tpr


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def chi_square_p(observed: list[int], expected_shares: list[float]) -> float:
    """p-value of Pearson's chi-square goodness-of-fit test (survival function of chi2, k-1 dof)."""
    n = sum(observed)
    stat = sum((o - n * p) ** 2 / (n * p) for o, p in zip(observed, expected_shares) if p > 0)
    return chi2_sf(stat, len(observed) - 1)


def chi2_sf(x: float, k: int) -> float:
    """Survival function of the chi-square distribution with k degrees of freedom."""
    if x <= 0:
        return 1.0
    return _upper_gamma_regularized(k / 2.0, x / 2.0)


def _upper_gamma_regularized(a: float, x: float) -> float:
    if x < a + 1:  # series for the lower function
        term = total = 1.0 / a
        n = a
        for _ in range(1000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - math.lgamma(a)))
    b, c, d = x + 1 - a, 1e300, 1 / (x + 1 - a)  # continued fraction (Lentz)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / d if abs(d) > 1e-300 else 1e300
        c = b + an / c if abs(c) > 1e-300 else b + an / 1e-300
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h


def auc_p_value(auc: float, n_pos: int, n_neg: int) -> float:
    """Two-sided p-value of AUC = 0.5 (Mann-Whitney U, normal approximation, no tie correction)."""
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    sd = math.sqrt((n_pos + n_neg + 1) / (12.0 * n_pos * n_neg))
    return math.erfc(abs(auc - 0.5) / sd / math.sqrt(2))


def auc_interval(auc: float, n_pos: int, n_neg: int, z: float = 1.96) -> tuple[float, float]:
    """95% interval of an AUC (Hanley and McNeil's standard error)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (n_pos - 1) * (q1 - auc * auc) + (n_neg - 1) * (q2 - auc * auc)) / (n_pos * n_neg)
    half = z * math.sqrt(max(var, 0.0))
    return max(0.0, auc - half), min(1.0, auc + half)
