"""The (n-1) attack on windowed telemetry: an operator who also runs the gateway fills a window with
K-1 requests of its own, whose figures it knows exactly, and one victim's; when the window closes it
subtracts what it knows from what was published and reads what is left as the victim's.

The victim's request is one of two: a short answer that stopped by itself, or a long one cut at
max_tokens. The attacker knows both candidates (the figures each would fold into a window) and picks
the one whose expected exposition is nearer, in L1 over the counters it reads (those whose names start
with a prefix: the finish reasons, say), to what it read: with no noise on them that names the
victim's candidate every time; with noise of one scale on every published count it is the
maximum-likelihood guess between the two."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    finish: str
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    itl_s: float
    e2e_s: float


# The victim's two candidates, and what every one of the attacker's own requests looks like.
SHORT = Candidate("stop", 60, 3, 0.04, 0.02, 0.2)
LONG = Candidate("length", 900, 700, 1.5, 0.2, 45.0)
OWN = Candidate("stop", 40, 2, 0.006, 0.004, 0.008)


def counters(exposition: str, prefix: str) -> dict[str, float]:
    """The counter series (`..._total`) of an exposition whose names start with `prefix`."""
    out = {}
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            if key.startswith(prefix) and key.split("{")[0].endswith("_total"):
                out[key] = float(value)
    return out


def fold(telemetry, c: Candidate) -> None:
    """One request with these figures, as the server reports it to its telemetry when it ends."""
    telemetry.ttft(c.ttft_s)
    telemetry.itl(c.itl_s)
    telemetry.finished([c.finish], c.prompt_tokens, c.output_tokens)
    telemetry.e2e(c.e2e_s)
    telemetry.request("completions", "ok")


def window_delta(telemetry, clock, victim: Candidate, own: int, prefix: str) -> dict[str, float]:
    """Close one window of `own` attacker requests and the victim's; the counters' advance."""
    before = counters(telemetry.render(), prefix)
    clock.now += 61.0
    for _ in range(own):
        fold(telemetry, OWN)
    fold(telemetry, victim)
    after = counters(telemetry.render(), prefix)
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def attack_accuracy(
    make_telemetry: Callable,
    make_exact: Callable,
    clock,
    trials: int,
    own: int,
    rng: random.Random,
    prefix: str = "traceless_finished_total",
) -> float:
    """The share of `trials` windows in which the attacker names the victim's candidate.
    `make_telemetry()` is the node's telemetry under attack (it keeps its state across windows,
    as a node's does); `make_exact()` a fresh one without noise, on which the attacker computes what
    each candidate would publish (it knows the mechanism, only not the noise)."""
    expected = {}
    for cand in (SHORT, LONG):
        expected[cand] = window_delta(make_exact(), clock, cand, own, prefix)
    target, right = make_telemetry(), 0
    for _ in range(trials):
        victim = rng.choice((SHORT, LONG))
        seen = window_delta(target, clock, victim, own, prefix)
        distance = {c: l1(seen, expected[c]) for c in (SHORT, LONG)}
        guess = min((SHORT, LONG), key=lambda c: (distance[c], rng.random()))
        right += guess == victim
    return right / trials


def l1(seen: dict[str, float], expected: dict[str, float]) -> float:
    """Over the series the target publishes (a noisy one leaves out what it cannot noise)."""
    return sum(abs(v - expected.get(k, 0.0)) for k, v in seen.items())
