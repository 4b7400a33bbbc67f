"""Prometheus metrics from an explicit allowlist.

Every metric name, label name and label value is declared here; setting anything else raises.
Values are counts, bucketed durations and ratios, so the exposition can carry no user content.
What reaches the registry is decided by server/telemetry.py: request figures only as aggregates
of a window of many requests, published when the window closes (docs/telemetry.md). There is no
histogram a scrape before and after one request could difference, and none of these metrics is
served on the public port (server/operator_app.py: the operator's own listener).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import prometheus_client
import prometheus_client.registry
from prometheus_client.core import CounterMetricFamily

ENDPOINT = ("completions", "chat_completions")
STATUS = ("ok", "error", "aborted", "rejected")
FINISH = ("stop", "length", "abort", "error")
QUANTILE = ("0.5", "0.9", "0.99")
# Latencies are published as the upper bound of the bucket their window quantile falls in.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Requests are counted by the size class of their prompt and of their output (upper bounds in tokens;
# "+Inf" holds the rest), not summed: one request moves one class's count by one.
PROMPT_CLASSES = ("128", "512", "2048", "8192", "32768", "+Inf")
OUTPUT_CLASSES = ("16", "64", "256", "1024", "4096", "+Inf")


@dataclass(frozen=True, slots=True)
class Spec:
    name: str
    kind: str  # counter | gauge
    help: str
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)


_WINDOW = " (published when a telemetry window closes)"
SPECS = (
    Spec(
        "traceless_requests_total",
        "counter",
        "Requests by endpoint and outcome" + _WINDOW + ".",
        {"endpoint": ENDPOINT, "status": STATUS},
    ),
    Spec(
        "traceless_finished_total",
        "counter",
        "Finished generations by finish reason" + _WINDOW + ".",
        {"finish_reason": FINISH},
    ),
    Spec(
        "traceless_requests_by_prompt_tokens_total",
        "counter",
        "Requests by their prompt's size class, in tokens" + _WINDOW + ".",
        {"tokens_le": PROMPT_CLASSES},
    ),
    Spec(
        "traceless_requests_by_generation_tokens_total",
        "counter",
        "Requests by their output's size class, in tokens" + _WINDOW + ".",
        {"tokens_le": OUTPUT_CLASSES},
    ),
    Spec("traceless_prompt_tokens_total", "counter", "Prompt tokens, rounded up to 1024s" + _WINDOW + "."),
    Spec("traceless_generation_tokens_total", "counter", "Generated tokens, rounded up to 1024s" + _WINDOW + "."),
    Spec("traceless_telemetry_windows_total", "counter", "Telemetry windows published."),
    Spec("traceless_window_requests", "gauge", "Requests in the last published window."),
    Spec(
        "traceless_window_time_to_first_token_seconds",
        "gauge",
        "Time to first token in the last window: the bucket bound at or above the quantile.",
        {"quantile": QUANTILE},
    ),
    Spec(
        "traceless_window_inter_token_latency_seconds",
        "gauge",
        "Time between successive token-producing steps in the last window (bucket bound at or above the quantile).",
        {"quantile": QUANTILE},
    ),
    Spec(
        "traceless_window_e2e_request_latency_seconds",
        "gauge",
        "End-to-end latency in the last window (bucket bound at or above the quantile).",
        {"quantile": QUANTILE},
    ),
    Spec("traceless_window_peak_requests_running", "gauge", "Most requests in the running batch during the window."),
    Spec("traceless_window_peak_requests_waiting", "gauge", "Most requests waiting during the window."),
    Spec(
        "traceless_window_peak_kv_cache_usage_ratio",
        "gauge",
        "Largest fraction of KV blocks in use during the window, rounded up to 0.05.",
    ),
    Spec("traceless_kv_blocks_nonzero", "gauge", "KV blocks holding non-zero values at the last idle scan" + _WINDOW),
    Spec("traceless_prefix_cache_blocks", "gauge", "Blocks in the prefix cache at the last idle scan" + _WINDOW),
    Spec(
        "traceless_kv_offload_swapped_requests",
        "gauge",
        "Requests with sealed offloaded KV at the last idle scan" + _WINDOW,
    ),
    Spec("traceless_spec_decode_num_draft_tokens_total", "counter", "Speculative draft tokens verified" + _WINDOW),
    Spec("traceless_spec_decode_num_accepted_tokens_total", "counter", "Speculative draft tokens accepted" + _WINDOW),
    Spec(
        "traceless_spec_decode_num_verify_steps_total",
        "counter",
        "(request, step) pairs that verified at least one draft token" + _WINDOW,
    ),
)


# What one request could change by more than a count of one, or through when it ended rather than
# what it was: published only by a telemetry without noise (an audit's or a benchmark's, never a
# node's default), never with noise (server/telemetry.py).
EXACT_ONLY = frozenset(
    {
        "traceless_prompt_tokens_total",
        "traceless_generation_tokens_total",
        "traceless_window_inter_token_latency_seconds",
        "traceless_window_peak_requests_running",
        "traceless_window_peak_requests_waiting",
        "traceless_window_peak_kv_cache_usage_ratio",
        "traceless_spec_decode_num_draft_tokens_total",
        "traceless_spec_decode_num_accepted_tokens_total",
        "traceless_spec_decode_num_verify_steps_total",
    }
)
NOISY_SPECS = tuple(s for s in SPECS if s.name not in EXACT_ONLY)


class UnknownMetric(ValueError):
    pass


class Metrics:
    """The allowlist as a thin wrapper over prometheus_client: a name, label or label value that is
    not declared in SPECS cannot be set (it raises), and nothing else reaches the registry.
    Counters are kept by their owner (the telemetry window) and copied in as totals; series of when
    each label set was first seen (`_created`) are off: they would time requests."""

    def __init__(self, specs: tuple[Spec, ...] = SPECS):
        prometheus_client.disable_created_metrics()
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        self._specs = {s.name: s for s in specs}
        self._counters = _Counters()
        self._gauges: dict[str, Any] = {}
        for spec in specs:
            if spec.kind == "gauge":
                self._gauges[spec.name] = prometheus_client.Gauge(
                    spec.name, spec.help, sorted(spec.labels), registry=self.registry
                )
            else:
                self._counters.declare(spec)
        self.registry.register(self._counters)

    def _check(self, name: str, kind: str, labels: dict[str, str]) -> Spec:
        spec = self._specs.get(name)
        if spec is None or spec.kind != kind:
            raise UnknownMetric(f"{name} is not an allowlisted {kind}")
        if set(labels) != set(spec.labels):
            raise UnknownMetric(f"{name} takes labels {sorted(spec.labels)}")
        for k, v in labels.items():
            if v not in spec.labels[k]:
                raise UnknownMetric(f"{name}: label {k} has no allowlisted value for this observation")
        return spec

    def set(self, name: str, value: float, **labels: str) -> None:
        self._check(name, "gauge", labels)
        gauge = self._gauges[name]
        (gauge.labels(**labels) if labels else gauge).set(value)

    def set_total(self, name: str, value: float, **labels: str) -> None:
        """A counter's total, as kept by its owner."""
        self._check(name, "counter", labels)
        self._counters.set(name, tuple(sorted(labels.items())), value)

    def render(self) -> str:
        return prometheus_client.generate_latest(self.registry).decode()


class _Counters(prometheus_client.registry.Collector):
    def __init__(self) -> None:
        self._specs: dict[str, Spec] = {}
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._lock = threading.Lock()

    def declare(self, spec: Spec) -> None:
        self._specs[spec.name] = spec

    def set(self, name: str, labels: tuple[tuple[str, str], ...], value: float) -> None:
        with self._lock:
            self._values[(name, labels)] = float(value)

    def collect(self):
        with self._lock:
            values = dict(self._values)
        for name, spec in self._specs.items():
            names = sorted(spec.labels)
            family = CounterMetricFamily(name.removesuffix("_total"), spec.help, labels=names)
            series = [(labels, v) for (n, labels), v in sorted(values.items()) if n == name]
            if not names and not series:
                series = [((), 0.0)]
            for labels, v in series:
                family.add_metric([value for _, value in labels], v)
            yield family
