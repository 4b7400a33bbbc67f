"""Telemetry that cannot count one request: figures of requests reach the metrics and the logs
only as aggregates of a window of many requests, each with calibrated noise.

A window collects what the requests that end in it did (outcomes, finish reasons, size classes,
latencies, the load seen as they ended). It closes at the first check (a request ending, a scrape)
at least `window_s` seconds after it opened at which it holds at least `min_requests` requests;
until then it keeps growing, and nothing of it is visible. When it closes, its aggregates are
published at once and one `metrics.window` event is logged. A scrape before and after one request
therefore reads the same numbers unless a whole window of at least `min_requests` requests closed
in between.

Someone who sends all but one of a window's requests can subtract its own figures from the window's
(the n-1 attack), so every published count carries noise: each is a histogram in which one request
is counted once (requests by endpoint and outcome, by finish reason, by prompt and output size
class, by time-to-first-token and end-to-end latency bucket), and every cell gets discrete Laplace
noise of one scale (privacy/noise.py), chosen so that the window as a whole is epsilon-differentially
private for one request (`SENSITIVITY`, below). Counters advance by the noisy counts; quantiles are
read from the noisy histograms (post-processing costs no privacy). Figures one request could move
by more than one (token sums, peaks, engine counters) are published only without noise.

`epsilon = None` publishes exact figures, and `min_requests = 0` every window however few requests
it holds: the explicit "off" switches, for audits and benchmarks only (docs/telemetry.md).
"""

from __future__ import annotations

import math
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from traceless.events import emit
from traceless.privacy.noise import discrete_laplace, scale_for
from traceless.server.metrics import (
    ENDPOINT,
    FINISH,
    LATENCY_BUCKETS,
    NOISY_SPECS,
    OUTPUT_CLASSES,
    PROMPT_CLASSES,
    QUANTILE,
    SPECS,
    STATUS,
    Metrics,
)

# Token counters are published rounded up to a multiple of this: a total is known only to within a
# unit either way, and rounding up keeps a few short generations from reading as none at all.
TOKEN_UNIT = 1024
KV_USAGE_STEP = 0.05  # the peak KV usage is published rounded up to a multiple of this
DEFAULT_EPSILON = 1.0
# A request's finish reason, when its choices ended differently: the first of these among them.
FINISH_ORDER = ("error", "abort", "length", "stop")
# The noisy histograms of a window, each a count per cell in which one request is counted at most
# once: replacing one request by any other moves one cell down by one and another up by one, an L1
# change of 2 per histogram. Their sum is the window's sensitivity, over which epsilon is spent.
NOISY_HISTOGRAMS = ("requests", "finished", "prompt_class", "output_class", "ttft", "e2e")
SENSITIVITY = 2 * len(NOISY_HISTOGRAMS)


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    window_s: float = 60.0
    min_requests: int = 20
    epsilon: float | None = DEFAULT_EPSILON  # per window, for one request; None: exact (audits only)

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError("the telemetry window must be a positive number of seconds")
        if isinstance(self.min_requests, bool) or not isinstance(self.min_requests, int) or self.min_requests < 0:
            raise ValueError("the telemetry window's minimum number of requests must be an integer >= 0")
        if self.epsilon is not None and not (0.01 <= self.epsilon <= 100 and math.isfinite(self.epsilon)):
            raise ValueError("the telemetry epsilon must be a number from 0.01 to 100 (or off)")


class _Buckets:
    """Counts of values per latency bucket (the last one open-ended): constant memory."""

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)

    def add(self, value: float) -> None:
        i = next((i for i, bound in enumerate(LATENCY_BUCKETS) if value <= bound), len(LATENCY_BUCKETS))
        self.counts[i] += 1

    def bound(self, q: float) -> float:
        """The bound of the bucket holding the q-quantile (values past the last bound show as it)."""
        return quantile_bound(self.counts, q)


def quantile_bound(counts: list[int], q: float) -> float:
    """The bound of the bucket holding the q-quantile of per-bucket counts (negative noisy counts
    read as none; the last, open bucket shows as the last bound)."""
    counts = [max(0, n) for n in counts]
    total = sum(counts)
    if not total:
        return 0.0
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= q * total:
            return LATENCY_BUCKETS[min(i, len(LATENCY_BUCKETS) - 1)]
    return LATENCY_BUCKETS[-1]


def size_class(tokens: int, classes: tuple[str, ...]) -> int:
    return next((i for i, bound in enumerate(classes[:-1]) if tokens <= int(bound)), len(classes) - 1)


@dataclass(slots=True)
class _Window:
    opened: float
    requests: dict[tuple[str, str], int] = field(default_factory=dict)  # (endpoint, status) -> count
    finished: dict[str, int] = field(default_factory=dict)  # one reason per request
    prompt_class: list[int] = field(default_factory=lambda: [0] * len(PROMPT_CLASSES))
    output_class: list[int] = field(default_factory=lambda: [0] * len(OUTPUT_CLASSES))
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: _Buckets = field(default_factory=_Buckets)
    itl: _Buckets = field(default_factory=_Buckets)
    e2e: _Buckets = field(default_factory=_Buckets)
    peak_running: int = 0
    peak_waiting: int = 0
    peak_kv: float = 0.0

    @property
    def num_requests(self) -> int:
        return sum(self.requests.values())


class Telemetry:
    """Collects request figures into windows and publishes closed windows to `metrics`.

    `engine` (an AsyncEngine, optional) is read for load and residue gauges; `clock` is for tests;
    `rng` draws the noise: the operating system's CSPRNG unless a test passes a seeded generator.
    Observations come from the event loop, scrapes from the operator listener: one lock."""

    def __init__(
        self,
        policy: WindowPolicy = WindowPolicy(),
        engine=None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ):
        self.policy = policy
        self.exact = policy.epsilon is None
        self.metrics = Metrics(SPECS if self.exact else NOISY_SPECS)
        self._scale = None if policy.epsilon is None else scale_for(policy.epsilon, SENSITIVITY)
        self._rng = rng or secrets.SystemRandom()
        self._engine = engine
        self._clock = clock
        self._lock = threading.Lock()
        self._window = _Window(clock())
        # running sums of the published (noisy) window counts, and what each counter last showed:
        # a counter never goes down, so it shows the largest sum yet
        self._sums: dict[tuple[str, tuple[tuple[str, str], ...]], list[int]] = {}
        self._tokens = [0, 0]  # prompt, generated: exact running totals, published rounded (exact only)
        self._windows = 0

    # --- observations (they stay in the open window) -------------------------------------------
    def request(self, endpoint: str, status: str) -> None:
        """A request ended with this outcome (the window's request count)."""
        with self._lock:
            w = self._window
            w.requests[(endpoint, status)] = w.requests.get((endpoint, status), 0) + 1
            self._sample_load(w)
            self._maybe_publish()

    def finished(self, reasons: list[str], prompt_tokens: int, output_tokens: int) -> None:
        """A request's generation ended: its choices' finish reasons and its token counts."""
        with self._lock:
            w = self._window
            reason = next((r for r in FINISH_ORDER if r in reasons), None)
            if reason is not None:
                w.finished[reason] = w.finished.get(reason, 0) + 1
            w.prompt_class[size_class(prompt_tokens, PROMPT_CLASSES)] += 1
            w.output_class[size_class(output_tokens, OUTPUT_CLASSES)] += 1
            w.prompt_tokens += prompt_tokens
            w.output_tokens += output_tokens

    def ttft(self, seconds: float) -> None:
        with self._lock:
            self._window.ttft.add(seconds)

    def itl(self, seconds: float) -> None:
        with self._lock:
            self._window.itl.add(seconds)

    def e2e(self, seconds: float) -> None:
        with self._lock:
            self._window.e2e.add(seconds)

    # --- publication ----------------------------------------------------------------------------
    def render(self) -> str:
        """The exposition for a scrape (a window that is due closes first)."""
        with self._lock:
            self._maybe_publish()
        return self.metrics.render()

    def _sample_load(self, w: _Window) -> None:
        if self._engine is None:
            return
        s = self._engine.stats()
        w.peak_running = max(w.peak_running, s.num_running)
        w.peak_waiting = max(w.peak_waiting, s.num_waiting)
        w.peak_kv = max(w.peak_kv, s.kv_usage)

    def _maybe_publish(self) -> None:
        now = self._clock()
        w = self._window
        if now - w.opened < self.policy.window_s or w.num_requests < self.policy.min_requests:
            return
        self._sample_load(w)
        self._window = _Window(now)
        self._publish(w)

    def _noisy(self, count: int) -> int:
        """One cell of one of the window's histograms, as published."""
        return count if self._scale is None else count + discrete_laplace(self._scale, self._rng)

    def _advance(self, name: str, count: int, **labels: str) -> int:
        """A counter advanced by a window's (noisy) count; returns the noisy count."""
        noisy = self._noisy(count)
        entry = self._sums.setdefault((name, tuple(sorted(labels.items()))), [0, 0])
        entry[0] += noisy
        entry[1] = max(entry[1], entry[0])
        self.metrics.set_total(name, entry[1], **labels)
        return noisy

    def _publish(self, w: _Window) -> None:
        m = self.metrics
        self._windows += 1
        statuses = dict.fromkeys(STATUS, 0)
        for endpoint, status in ((e, s) for e in ENDPOINT for s in STATUS):
            n = self._advance(
                "traceless_requests_total", w.requests.get((endpoint, status), 0), endpoint=endpoint, status=status
            )
            statuses[status] += max(0, n)
        for reason in FINISH:
            self._advance("traceless_finished_total", w.finished.get(reason, 0), finish_reason=reason)
        for name, classes, counts in (
            ("traceless_requests_by_prompt_tokens_total", PROMPT_CLASSES, w.prompt_class),
            ("traceless_requests_by_generation_tokens_total", OUTPUT_CLASSES, w.output_class),
        ):
            for bound, n in zip(classes, counts):
                self._advance(name, n, tokens_le=bound)
        m.set_total("traceless_telemetry_windows_total", self._windows)
        # the gateway that routed them saw every request arrive: their number is no secret from it
        m.set("traceless_window_requests", w.num_requests)
        ttft = [self._noisy(n) for n in w.ttft.counts]
        e2e = [self._noisy(n) for n in w.e2e.counts]
        for q in QUANTILE:
            m.set("traceless_window_time_to_first_token_seconds", quantile_bound(ttft, float(q)), quantile=q)
            m.set("traceless_window_e2e_request_latency_seconds", quantile_bound(e2e, float(q)), quantile=q)
        if self.exact:
            self._publish_exact(w)
        self._publish_residue()
        emit(
            "metrics.window",
            requests=w.num_requests,
            ttft_p50_s=quantile_bound(ttft, 0.5),
            e2e_p50_s=quantile_bound(e2e, 0.5),
            **statuses,
        )

    def _publish_exact(self, w: _Window) -> None:
        """What only a telemetry without noise publishes: token sums, peaks, engine counters."""
        m = self.metrics
        self._tokens[0] += w.prompt_tokens
        self._tokens[1] += w.output_tokens
        m.set_total("traceless_prompt_tokens_total", _round_up(self._tokens[0]))
        m.set_total("traceless_generation_tokens_total", _round_up(self._tokens[1]))
        for q in QUANTILE:
            m.set("traceless_window_inter_token_latency_seconds", w.itl.bound(float(q)), quantile=q)
        m.set("traceless_window_peak_requests_running", w.peak_running)
        m.set("traceless_window_peak_requests_waiting", w.peak_waiting)
        m.set(
            "traceless_window_peak_kv_cache_usage_ratio", min(1.0, math.ceil(w.peak_kv / KV_USAGE_STEP) * KV_USAGE_STEP)
        )
        if self._engine is not None:
            s = self._engine.stats()
            m.set_total("traceless_spec_decode_num_draft_tokens_total", s.spec["proposed"])
            m.set_total("traceless_spec_decode_num_accepted_tokens_total", s.spec["accepted"])
            m.set_total("traceless_spec_decode_num_verify_steps_total", s.spec["verify_steps"])

    def _publish_residue(self) -> None:
        """The engine's last idle scan of residue, as of this publication."""
        r = None if self._engine is None else self._engine.residue
        if r is not None:
            m = self.metrics
            m.set("traceless_kv_blocks_nonzero", r.nonzero_blocks)
            m.set("traceless_prefix_cache_blocks", r.cached_blocks)
            m.set("traceless_kv_offload_swapped_requests", r.swapped_requests)


def _round_up(tokens: int) -> int:
    return -(-tokens // TOKEN_UNIT) * TOKEN_UNIT
