"""Telemetry that cannot count one request: figures of requests reach the metrics and the logs
only as aggregates of a window of many requests.

A window collects what the requests that end in it did (outcomes, finish reasons, token counts,
latencies, the load seen as they ended). It closes at the first check (a request ending, a scrape)
at least `window_s` seconds after it opened at which it holds at least `min_requests` requests;
until then it keeps growing, and nothing of it is visible. When it closes, its aggregates are
published at once: counters advance by the window's totals (tokens rounded up to 1024s),
latencies become per-quantile bucket bounds, load becomes the window's peaks, and one
`metrics.window` event is logged. A scrape before and after one request therefore reads the same
numbers unless a whole window of at least `min_requests` requests closed in between.

`min_requests = 0` publishes every window however few requests it holds: the explicit "off"
switch, for audits and benchmarks only (docs/telemetry.md).
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from traceless.events import emit
from traceless.server.metrics import FINISH, LATENCY_BUCKETS, QUANTILE, Metrics

# Token counters are published rounded up to a multiple of this: a total is known only to within a
# unit either way, and rounding up keeps a few short generations from reading as none at all.
TOKEN_UNIT = 1024
KV_USAGE_STEP = 0.05  # the peak KV usage is published rounded up to a multiple of this


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    window_s: float = 60.0
    min_requests: int = 20

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError("the telemetry window must be a positive number of seconds")
        if isinstance(self.min_requests, bool) or not isinstance(self.min_requests, int) or self.min_requests < 0:
            raise ValueError("the telemetry window's minimum number of requests must be an integer >= 0")


class _Buckets:
    """Counts of values per latency bucket (the last one open-ended): constant memory."""

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)

    def add(self, value: float) -> None:
        i = next((i for i, bound in enumerate(LATENCY_BUCKETS) if value <= bound), len(LATENCY_BUCKETS))
        self.counts[i] += 1

    def bound(self, q: float) -> float:
        """The bound of the bucket holding the q-quantile (values past the last bound show as it)."""
        total = sum(self.counts)
        if not total:
            return 0.0
        seen = 0
        for i, n in enumerate(self.counts):
            seen += n
            if seen >= q * total:
                return LATENCY_BUCKETS[min(i, len(LATENCY_BUCKETS) - 1)]
        return LATENCY_BUCKETS[-1]


@dataclass(slots=True)
class _Window:
    opened: float
    requests: dict[tuple[str, str], int] = field(default_factory=dict)  # (endpoint, status) -> count
    finished: dict[str, int] = field(default_factory=dict)
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

    `engine` (an AsyncEngine, optional) is read for load and residue gauges; `clock` is for tests.
    Observations come from the event loop, scrapes from the operator listener: one lock."""

    def __init__(self, policy: WindowPolicy = WindowPolicy(), engine=None,
                 clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self.metrics = Metrics()
        self._engine = engine
        self._clock = clock
        self._lock = threading.Lock()
        self._window = _Window(clock())
        self._requests: dict[tuple[str, str], int] = {}
        self._finished: dict[str, int] = {}
        self._tokens = [0, 0]  # prompt, generated: exact running totals, published rounded
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
        with self._lock:
            w = self._window
            for r in reasons:
                if r in FINISH:
                    w.finished[r] = w.finished.get(r, 0) + 1
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

    def _publish(self, w: _Window) -> None:
        m = self.metrics
        self._windows += 1
        for key, n in w.requests.items():
            self._requests[key] = self._requests.get(key, 0) + n
        for reason, n in w.finished.items():
            self._finished[reason] = self._finished.get(reason, 0) + n
        self._tokens[0] += w.prompt_tokens
        self._tokens[1] += w.output_tokens
        for (endpoint, status), n in self._requests.items():
            m.set_total("traceless_requests_total", n, endpoint=endpoint, status=status)
        for reason, n in self._finished.items():
            m.set_total("traceless_finished_total", n, finish_reason=reason)
        m.set_total("traceless_prompt_tokens_total", _round_up(self._tokens[0]))
        m.set_total("traceless_generation_tokens_total", _round_up(self._tokens[1]))
        m.set_total("traceless_telemetry_windows_total", self._windows)
        m.set("traceless_window_requests", w.num_requests)
        for q in QUANTILE:
            m.set("traceless_window_time_to_first_token_seconds", w.ttft.bound(float(q)), quantile=q)
            m.set("traceless_window_inter_token_latency_seconds", w.itl.bound(float(q)), quantile=q)
            m.set("traceless_window_e2e_request_latency_seconds", w.e2e.bound(float(q)), quantile=q)
        m.set("traceless_window_peak_requests_running", w.peak_running)
        m.set("traceless_window_peak_requests_waiting", w.peak_waiting)
        m.set("traceless_window_peak_kv_cache_usage_ratio", min(1.0, math.ceil(w.peak_kv / KV_USAGE_STEP)
                                                                   * KV_USAGE_STEP))
        self._publish_engine()
        statuses = {s: sum(n for (_, st), n in w.requests.items() if st == s) for s in ("ok", "rejected", "error",
                                                                                      "aborted")}
        emit("metrics.window", requests=w.num_requests, prompt_tokens=_round_up(w.prompt_tokens),
             output_tokens=_round_up(w.output_tokens), ttft_p50_s=w.ttft.bound(0.5), e2e_p50_s=w.e2e.bound(0.5),
             **statuses)

    def _publish_engine(self) -> None:
        """Engine counters and the last idle scan's residue, as of this publication."""
        if self._engine is None:
            return
        m, s = self.metrics, self._engine.stats()
        m.set_total("traceless_spec_decode_num_draft_tokens_total", s.spec["proposed"])
        m.set_total("traceless_spec_decode_num_accepted_tokens_total", s.spec["accepted"])
        m.set_total("traceless_spec_decode_num_verify_steps_total", s.spec["verify_steps"])
        r = self._engine.residue
        if r is not None:
            m.set("traceless_kv_blocks_nonzero", r.nonzero_blocks)
            m.set("traceless_prefix_cache_blocks", r.cached_blocks)
            m.set("traceless_kv_offload_swapped_requests", r.swapped_requests)


def _round_up(tokens: int) -> int:
    return -(-tokens // TOKEN_UNIT) * TOKEN_UNIT
