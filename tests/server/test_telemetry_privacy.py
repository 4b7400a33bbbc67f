"""The (n-1) attack on windowed telemetry (tests/support/window_attack.py): with 19 requests of its
own in a window of 20, an operator reads the victim's finish reason from the published counters.
The published counts carry noise calibrated to the node's epsilon, so the attacker can do no better
than epsilon-differential privacy allows: between two candidate requests, with even odds, no
attacker names the right one more often than e^eps / (1 + e^eps)."""

from __future__ import annotations

import math
import random

import pytest

from tests.support.window_attack import attack_accuracy
from traceless.server.telemetry import Telemetry, WindowPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


TRIALS = 400


def run_attack(prefix: str, epsilon: float | None, seed: int = 7) -> float:
    """The attack's accuracy over TRIALS windows of 19 + 1 against the default window, the noise
    drawn by the real mechanism from a seeded generator (so the figure repeats)."""
    clock, rng = Clock(), random.Random(seed)
    return attack_accuracy(
        lambda: Telemetry(WindowPolicy(60.0, 20, epsilon), clock=clock, rng=rng),
        lambda: Telemetry(WindowPolicy(60.0, 20, None), clock=clock),
        clock,
        trials=TRIALS,
        own=19,
        rng=rng,
        prefix=prefix,
    )


def dp_bound(epsilon: float) -> float:
    """The best accuracy epsilon-DP allows between two candidates at even odds, plus three binomial
    standard deviations of TRIALS trials (an attacker exactly at the bound exceeds this with
    probability < 0.0015)."""
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    return p + 3 * math.sqrt(p * (1 - p) / TRIALS)


def test_without_noise_the_attack_reads_the_victims_finish_reason():
    assert run_attack("traceless_finished_total", None) == 1.0
    assert run_attack("traceless_requests_by_generation_tokens_total", None) == 1.0


@pytest.mark.parametrize("prefix", ["traceless_finished_total", "traceless_"])
def test_the_n_minus_one_attack_learns_no_more_than_epsilon_allows(prefix):
    """The finish reasons alone, and every published counter together (the ML attacker's view)."""
    eps = WindowPolicy().epsilon
    assert eps == 1.0
    accuracy = run_attack(prefix, eps)
    assert accuracy <= dp_bound(eps)  # 0.731 + 0.067


def test_a_larger_epsilon_lets_the_attack_further():
    """The noise, not a broken attack, is what holds it down: at epsilon 32 (a noise scale of 3/8 of
    a request) it names the victim nearly every time."""
    assert run_attack("traceless_", 32.0) >= 0.9
