"""The discrete Laplace (two-sided geometric) mechanism, sampled exactly.

To publish an integer count c whose value one person's record can change by at most `sensitivity`,
publish c + Z with P[Z = z] proportional to exp(-|z| / scale) and scale = sensitivity / epsilon: the
result is epsilon-differentially private (Ghosh, Roughgarden and Sundararajan's geometric mechanism).
Several counts published together compose: their epsilons add (basic composition), which is how
`scale_for` spends one budget over every count of a release.

The sampler is Canonne, Kamath and Steinke's ("The Discrete Gaussian for Differential Privacy",
2020, algorithms 1 and 2): integer and rational arithmetic only, so no floating-point rounding
shapes the noise (the flaw Mironov found in textbook Laplace samplers), and its randomness comes
from the caller's generator: `secrets.SystemRandom()` (the operating system's CSPRNG) in a node,
a seeded `random.Random` in tests that must repeat.
"""

from __future__ import annotations

import random
from fractions import Fraction

# Epsilons and scales are held as fractions with a bounded denominator: the exact sampler needs a
# rational scale, and one in a million is far finer than any setting means.
MAX_DENOMINATOR = 10**6


def as_fraction(x: float | Fraction) -> Fraction:
    return Fraction(x).limit_denominator(MAX_DENOMINATOR)


def scale_for(epsilon: float | Fraction, total_sensitivity: int) -> Fraction:
    """The one noise scale that spends `epsilon` over counts whose sensitivities sum to
    `total_sensitivity` (L1, over everything published together): each count then costs
    its sensitivity / scale, and these add up to epsilon."""
    eps = as_fraction(epsilon)
    if eps <= 0 or total_sensitivity < 1:
        raise ValueError("epsilon must be positive and the sensitivity at least 1")
    return total_sensitivity / eps


def _bernoulli(p: Fraction, rng: random.Random) -> bool:
    """True with probability p (0 <= p <= 1), exactly."""
    return rng.randrange(p.denominator) < p.numerator


def bernoulli_exp(gamma: Fraction, rng: random.Random) -> bool:
    """True with probability exp(-gamma), gamma >= 0 rational (algorithm 1)."""
    while gamma > 1:  # exp(-gamma) = exp(-1)^floor(gamma) * exp(-(gamma - floor(gamma)))
        if not bernoulli_exp(Fraction(1), rng):
            return False
        gamma -= 1
    k = 1
    while _bernoulli(gamma / k, rng):
        k += 1
    return k % 2 == 1


def discrete_laplace(scale: Fraction, rng: random.Random) -> int:
    """Z with P[Z = z] proportional to exp(-|z| / scale), scale > 0 rational (algorithm 2)."""
    t, s = scale.numerator, scale.denominator  # exp(-|z| / scale) = exp(-|z| * s / t)
    while True:
        u = rng.randrange(t)
        if not bernoulli_exp(Fraction(u, t), rng):
            continue
        v = 0
        while bernoulli_exp(Fraction(1), rng):
            v += 1
        y = (u + t * v) // s  # u + t v is geometric with ratio exp(-1/t); y with ratio exp(-s/t)
        negative = _bernoulli(Fraction(1, 2), rng)
        if negative and y == 0:
            continue  # zero would otherwise be drawn twice as often as it should
        return -y if negative else y
