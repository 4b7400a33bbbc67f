"""The stream-shape attack's timing readings find a signal where there is one and none where there is
none: ticks that carry tokens told from padding ticks by their jitter, and streams whose first
chunk came after the prefill budget."""

from __future__ import annotations

import numpy as np

from traceless_tools.audit.stream_observe import Trace
from traceless_tools.audit.stream_timing import gap_jitter, late_first_ticks, lateness

TICK, BUDGET = 0.1, 0.5


def stream(
    rng,
    content_ticks: int,
    real_sd: float,
    padding_sd: float,
    first: float = BUDGET + 0.004,
    first_token: float = 0.3,
    ticks: int = 64,
) -> Trace:
    """A stream of `ticks` chunks on the grid from `first`, each late by |N(0, sd)| of its kind: the
    first `content_ticks` carry tokens."""
    carried = tuple(0 < k <= content_ticks for k in range(ticks))
    late = [abs(rng.normal(0, real_sd if c else padding_sd)) for c in carried]
    times = tuple(first + k * TICK + x for k, x in enumerate(late))
    return Trace(1080, (4114,) * ticks, times, first, first_token, times[content_ticks], content_ticks, carried)


def test_a_noisier_timer_while_tokens_flow_is_read_and_an_even_one_is_not():
    rng = np.random.default_rng(3)
    lengths = [1, 4, 20, 40] * 10  # natural lengths: what padding ticks that looked different would show
    leaky = gap_jitter([stream(rng, n, 0.010, 0.003) for n in lengths], TICK)
    assert leaky is not None and leaky["above_chance"] and leaky["accuracy"] > 0.7, leaky
    assert leaky["gap_sd_ms"]["real"]["median"] > 2 * leaky["gap_sd_ms"]["padding"]["median"]
    even = gap_jitter([stream(rng, n, 0.006, 0.006) for n in lengths], TICK)
    assert even is not None and not even["above_chance"], even
    lo, hi = even["chance_95_range"]
    assert lo < 0.5 < hi and min(even["windows"]) > 50


def test_no_padding_ticks_no_reading():
    rng = np.random.default_rng(4)
    assert gap_jitter([stream(rng, 63, 0.005, 0.005) for _ in range(8)], TICK) is None


def test_late_first_ticks_and_ticks_behind_the_grid():
    rng = np.random.default_rng(5)
    on_time = [stream(rng, 10, 0.002, 0.002, first_token=BUDGET + 0.4) for _ in range(6)]
    late = [stream(rng, 10, 0.002, 0.002, first=BUDGET + 0.2, first_token=BUDGET + 0.15) for _ in range(2)]
    got = late_first_ticks(on_time + late, TICK, lambda t: BUDGET)
    assert got["first_tick_late"] == 2 / 8 and got["first_token_past_budget"] == 1.0
    assert got["ticks_behind_grid"] == 0.0
    stalled = list(on_time[0].times)
    stalled[30:33] = [stalled[33]] * 3  # three ticks held up by a stall, then sent at once
    behind = late_first_ticks(
        [Trace(1080, on_time[0].sizes, tuple(stalled), carried=on_time[0].carried)], TICK, lambda t: BUDGET
    )
    assert behind["ticks_behind_grid"] == 3 / 63  # the last chunk (the end) is left out
    assert np.allclose(lateness([1.02, 1.1, 1.25, 1.3], TICK), [0.02, 0.0, 0.05, 0.0])
