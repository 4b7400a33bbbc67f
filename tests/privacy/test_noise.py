"""The discrete Laplace sampler draws from the distribution it names, and its scale spends the
stated epsilon."""

from __future__ import annotations

import math
import random
from collections import Counter
from fractions import Fraction

import pytest

from traceless.privacy.noise import bernoulli_exp, discrete_laplace, scale_for


def test_bernoulli_exp_has_the_probability_exp_minus_gamma():
    rng, n = random.Random(1), 20000
    for gamma in (Fraction(1, 3), Fraction(1), Fraction(5, 2)):
        p = math.exp(-gamma)
        hits = sum(bernoulli_exp(gamma, rng) for _ in range(n))
        assert abs(hits / n - p) < 4 * math.sqrt(p * (1 - p) / n)  # four standard deviations


@pytest.mark.parametrize("scale", [Fraction(2), Fraction(7, 3)])
def test_discrete_laplace_matches_its_probabilities(scale):
    rng, n = random.Random(2), 20000
    seen = Counter(discrete_laplace(scale, rng) for _ in range(n))
    a = math.exp(-1 / scale)
    for z in range(-3, 4):  # P[Z = z] = (1 - a) / (1 + a) * a^|z|
        p = (1 - a) / (1 + a) * a ** abs(z)
        assert abs(seen[z] / n - p) < 4 * math.sqrt(p * (1 - p) / n), z
    mean = sum(z * k for z, k in seen.items()) / n
    var = sum(z * z * k for z, k in seen.items()) / n - mean**2
    assert abs(mean) < 4 * math.sqrt(2 * a / (1 - a) ** 2 / n)
    assert var == pytest.approx(2 * a / (1 - a) ** 2, rel=0.1)


def test_a_tiny_scale_draws_zero():
    rng = random.Random(3)
    assert {discrete_laplace(Fraction(1, 1000), rng) for _ in range(200)} == {0}


def test_the_scale_spends_epsilon_over_the_summed_sensitivity():
    assert scale_for(1.0, 13) == 13
    assert scale_for(0.5, 13) == 26
    assert scale_for(Fraction(1, 3), 2) == 6
    for bad in ((0.0, 2), (-1.0, 2), (1.0, 0)):
        with pytest.raises(ValueError):
            scale_for(*bad)
