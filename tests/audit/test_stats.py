import math
import random

import pytest

from traceless_tools.audit.stats import (
    auc_interval,
    auc_p_value,
    best_threshold_accuracy,
    chi2_sf,
    chi_square_p,
    held_out_accuracy,
    roc_auc,
    wilson_interval,
)


def test_roc_auc_counts_pairs_and_ties():
    assert roc_auc([3, 4, 5], [1, 2, 3]) == pytest.approx(8.5 / 9)  # the (3, 3) pair counts one half
    assert roc_auc([1, 1], [1, 1]) == 0.5
    assert roc_auc([0], [1]) == 0.0


@pytest.mark.parametrize(
    "x, k, want", [(3.0, 3, 0.3916), (16.27, 3, 0.0010), (0.5, 1, 0.4795), (30, 9, 0.000439), (2.0, 2, math.exp(-1))]
)
def test_chi2_survival_matches_tables(x, k, want):
    assert chi2_sf(x, k) == pytest.approx(want, rel=2e-3)


def test_chi_square_detects_a_skew_and_accepts_a_fit():
    assert chi_square_p([250, 250, 250, 250], [0.25] * 4) > 0.99
    assert chi_square_p([400, 200, 200, 200], [0.25] * 4) < 1e-6


def test_intervals_and_p_values():
    lo, hi = wilson_interval(50, 100)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(0.1923, abs=1e-3)
    assert auc_p_value(0.5, 20, 20) == pytest.approx(1.0) and auc_p_value(1.0, 20, 20) < 1e-5
    lo, hi = auc_interval(0.8, 30, 30)
    assert lo < 0.8 < hi
    assert best_threshold_accuracy([5, 6, 7], [1, 2, 3]) == (1.0, 5)


def test_threshold_accuracy_sweep_matches_brute_force():
    rng = random.Random(3)
    for _ in range(50):
        pos = [rng.randint(0, 9) for _ in range(rng.randint(1, 12))]
        neg = [rng.randint(0, 9) for _ in range(rng.randint(1, 12))]
        n = len(pos) + len(neg)
        brute = max(
            [(max(len(pos), len(neg)) / n, float("inf"))]
            + [((sum(s >= t for s in pos) + sum(s < t for s in neg)) / n, t) for t in set(pos) | set(neg)]
        )
        assert best_threshold_accuracy(pos, neg) == brute


def test_held_out_accuracy_is_honest_on_noise_and_finds_signal():
    rng = random.Random(7)
    noise_pos = [rng.gauss(0, 1) for _ in range(60)]
    noise_neg = [rng.gauss(0, 1) for _ in range(60)]
    in_sample, _ = best_threshold_accuracy(noise_pos, noise_neg)
    held_out = held_out_accuracy(noise_pos, noise_neg)
    assert held_out < in_sample and held_out < 0.62
    assert held_out_accuracy([rng.gauss(3, 1) for _ in range(40)], [rng.gauss(0, 1) for _ in range(40)]) > 0.85
