"""Two timing readings of shaped streams, beside the stream-shape attack's topic classifier
(docs/shape-hiding.md): what a hop could read from when a stream's chunks leave, given the node's
published tick and prefill budget.

  gap jitter        can the relay tell the ticks sent while the answer is generated (from the first
                    chunk that carries content to the last: the victim's view labels them) from the
                    padding ticks after it, by their timing alone? Each stream's chunks are cut
                    into windows of WINDOW consecutive ticks of one phase; a classifier given each
                    window's spread of gaps and its lateness against the stream's grid names the
                    phase (balanced classes, stratified k-fold). At chance, the padding after a
                    short answer looks like the generation of a long one, so the natural length
                    stays hidden; the per-stream spread of gaps of each phase is reported too.
  late first tick   the share of streams whose first chunk came more than half a tick after the
                    prefill budget (a hop would read prefill time from it), next to the share whose
                    first chunk left without a token (prefill took longer than the budget: the
                    streams that put the defense to the test), and the share of ticks more than
                    half a tick behind their stream's grid.
"""

from __future__ import annotations

import random

import numpy as np

from traceless_tools.audit.stats import wilson_interval
from traceless_tools.audit.stream_observe import Trace

WINDOW = 6  # ticks per window: enough to estimate a spread, short enough for a 32-token answer


def lateness(times: list[float], tick_s: float) -> list[float]:
    """How far each chunk came after its instant on the stream's grid (anchored at its earliest chunk)."""
    offsets = [t - k * tick_s for k, t in enumerate(times)]
    anchor = min(offsets)
    return [o - anchor for o in offsets]


def phases(t: Trace) -> list[bool]:
    """Per chunk: within the content phase (from the first chunk that carried content to the last),
    while the engine works on the answer, or in the padding after it (or before it: a late head)."""
    marks = [k for k, c in enumerate(t.carried) if c]
    return [bool(marks) and marks[0] <= k <= marks[-1] for k in range(len(t.carried))]


def _windows(t: Trace, tick_s: float) -> list[tuple[list[float], bool]]:
    """(features, phase) of each window of WINDOW ticks of one phase; the head and the final chunk
    are left out (they are the start and the end, read by the other readings)."""
    times, phase = list(t.times[:-1]), phases(t)[:-1]
    late = lateness(times, tick_s)
    out = []
    k = 1
    while k + WINDOW <= len(times):
        kinds = set(phase[k : k + WINDOW])
        if len(kinds) == 1:
            gaps = np.diff(times[k - 1 : k + WINDOW])
            out.append(([float(np.std(gaps)), float(np.mean(late[k : k + WINDOW]))], kinds.pop()))
            k += WINDOW
        else:
            k += 1
    return out


def gap_jitter(traces: list[Trace], tick_s: float, folds: int = 4, seed: int = 0) -> dict | None:
    """The gap-jitter reading (module docstring); None when the streams have no padding ticks (shape off)."""
    from traceless_tools.audit.stream_shape import chance_interval, cross_validate

    if not any(t.carried and not all(phases(t)[1:-1]) for t in traces):
        return None
    windows = [w for t in traces for w in _windows(t, tick_s)]
    real = [f for f, c in windows if c]
    padding = [f for f, c in windows if not c]
    spread: dict[str, list[float]] = {"real": [], "padding": []}
    for t in traces:  # each gap labelled by the phase of the chunk it ends at
        gaps, kinds = np.diff(t.times[:-1]), np.array(phases(t)[1:-1], dtype=bool)
        for kind, mask in (("real", kinds), ("padding", ~kinds)):
            if mask.sum() > 2:
                spread[kind].append(float(np.std(gaps[mask])))
    out = {
        "window_ticks": WINDOW,
        "windows": [len(real), len(padding)],
        "gap_sd_ms": {k: _ms_summary(v) for k, v in spread.items()},
    }
    n = min(len(real), len(padding))
    if n < folds:
        return {**out, "accuracy": None}
    rng = random.Random(seed)  # balanced: as many windows of each kind
    x = np.array(rng.sample(real, n) + rng.sample(padding, n))
    y = np.repeat([1, 0], n)
    correct = int((cross_validate(x, y, 2, folds, seed) == y).sum())
    lo, hi = chance_interval(2 * n, 0.5)
    return {
        **out,
        "accuracy": correct / (2 * n),
        "accuracy_95ci": wilson_interval(correct, 2 * n),
        "chance_95_range": [lo, hi],
        "above_chance": correct / (2 * n) > hi,
    }


def _ms_summary(values: list[float]) -> dict:
    """Median and spread over the streams, in milliseconds."""
    if not values:
        return {"streams": 0}
    return {"streams": len(values), "median": 1000 * float(np.median(values)), "sd": 1000 * float(np.std(values))}


def late_first_ticks(traces: list[Trace], tick_s: float, budget_s) -> dict:
    """The late-first-tick reading (module docstring). `budget_s(trace)`: its request's prefill
    budget, as the node publishes it; times are from the request's send, so half a tick of slack."""
    slack = tick_s / 2
    late = [t.times[0] - budget_s(t) > slack for t in traces]
    slow = [bool(t.carried) and not t.carried[0] for t in traces]  # the first chunk left without a token
    behind = [x > slack for t in traces for x in lateness(list(t.times[:-1]), tick_s)]
    return {
        "streams": len(traces),
        "first_tick_late": sum(late) / len(traces),
        "first_tick_after_budget_ms": 1000 * max(t.times[0] - budget_s(t) for t in traces),
        "first_token_past_budget": sum(slow) / len(traces),
        "first_tick_s": [
            float(np.min([t.times[0] for t in traces])),
            float(np.median([t.times[0] for t in traces])),
            float(np.max([t.times[0] for t in traces])),
        ],
        "ticks_behind_grid": sum(behind) / max(1, len(behind)),
    }
