"""Prometheus metrics from an explicit allowlist.

Every metric name, label name and label value is declared here; observing anything else raises.
Values are counts, durations and ratios, so the exposition can carry no user content.
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
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True, slots=True)
class Spec:
    name: str
    kind: str  # counter | gauge | histogram
    help: str
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    buckets: tuple[float, ...] = ()
    mirrored: bool = False  # a counter the engine keeps, copied in at scrape time (set_total)


SPECS = (
    Spec("traceless_requests_total", "counter", "Requests by endpoint and outcome.",
         {"endpoint": ENDPOINT, "status": STATUS}),
    Spec("traceless_finished_total", "counter", "Finished generations by finish reason.", {"finish_reason": FINISH}),
    Spec("traceless_prompt_tokens_total", "counter", "Prompt tokens processed."),
    Spec("traceless_generation_tokens_total", "counter", "Tokens generated."),
    Spec("traceless_time_to_first_token_seconds", "histogram", "Time to first token.", buckets=LATENCY_BUCKETS),
    Spec("traceless_inter_token_latency_seconds", "histogram",
         "Time between a request's successive token-producing steps (a speculative step may produce several).",
         buckets=LATENCY_BUCKETS),
    Spec("traceless_e2e_request_latency_seconds", "histogram", "End-to-end request latency.", buckets=LATENCY_BUCKETS),
    Spec("traceless_num_requests_running", "gauge", "Requests in the running batch."),
    Spec("traceless_num_requests_waiting", "gauge", "Requests waiting to be scheduled."),
    Spec("traceless_kv_cache_usage_ratio", "gauge", "Fraction of KV cache blocks in use."),
    Spec("traceless_kv_blocks_nonzero", "gauge", "KV blocks holding non-zero values at the last idle scan."),
    Spec("traceless_prefix_cache_blocks", "gauge", "Blocks resident in the prefix cache at the last idle scan."),
    Spec("traceless_kv_offload_swapped_requests", "gauge", "Requests with sealed offloaded KV at the last idle scan."),
    Spec("traceless_spec_decode_num_draft_tokens_total", "counter", "Speculative draft tokens sent to verification.",
         mirrored=True),
    Spec("traceless_spec_decode_num_accepted_tokens_total", "counter", "Speculative draft tokens accepted.",
         mirrored=True),
    Spec("traceless_spec_decode_num_verify_steps_total", "counter",
         "(request, step) pairs that verified at least one draft token.", mirrored=True),
)


class UnknownMetric(ValueError):
    pass


class Metrics:
    """The allowlist as a thin wrapper over prometheus_client: a name, label or label value that is
    not declared in SPECS cannot be observed (it raises), and nothing else reaches the registry.
    Series of when each label set was first seen (`_created`) are off: they would time requests."""

    def __init__(self, specs: tuple[Spec, ...] = SPECS):
        prometheus_client.disable_created_metrics()
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        self._specs = {s.name: s for s in specs}
        self._mirrored = _MirroredCounters()  # counters the engine keeps, copied in at scrape time
        self._metrics: dict[str, Any] = {}
        for spec in specs:
            if spec.kind == "histogram":
                self._metrics[spec.name] = prometheus_client.Histogram(
                    spec.name, spec.help, buckets=spec.buckets, registry=self.registry)
            elif spec.kind == "gauge":
                self._metrics[spec.name] = prometheus_client.Gauge(spec.name, spec.help, registry=self.registry)
            elif spec.mirrored:
                self._mirrored.declare(spec)
            else:
                self._metrics[spec.name] = prometheus_client.Counter(
                    spec.name.removesuffix("_total"), spec.help, sorted(spec.labels), registry=self.registry)
        self.registry.register(self._mirrored)

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

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        spec = self._check(name, "counter", labels)
        if spec.mirrored:
            raise UnknownMetric(f"{name} is mirrored from the engine: use set_total")
        metric = self._metrics[name]
        (metric.labels(**labels) if labels else metric).inc(amount)

    def set(self, name: str, value: float) -> None:
        self._check(name, "gauge", {})
        self._metrics[name].set(value)

    def set_total(self, name: str, value: float) -> None:
        """A counter kept by its owner (the engine) and mirrored here at scrape time."""
        if not self._check(name, "counter", {}).mirrored:
            raise UnknownMetric(f"{name} is counted here: use inc")
        self._mirrored.set(name, value)

    def observe(self, name: str, value: float) -> None:
        self._check(name, "histogram", {})
        self._metrics[name].observe(value)

    def render(self) -> str:
        return prometheus_client.generate_latest(self.registry).decode()


class _MirroredCounters(prometheus_client.registry.Collector):
    def __init__(self) -> None:
        self._specs: dict[str, Spec] = {}
        self._values: dict[str, float] = {}
        self._lock = threading.Lock()

    def declare(self, spec: Spec) -> None:
        self._specs[spec.name] = spec

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self._values[name] = float(value)

    def collect(self):
        with self._lock:
            values = dict(self._values)
        for name, spec in self._specs.items():
            family = CounterMetricFamily(name.removesuffix("_total"), spec.help)
            family.add_metric([], values.get(name, 0.0))
            yield family


def set_engine_gauges(metrics: Metrics, engine) -> None:
    """Gauges read from an AsyncEngine (counts only)."""
    s = engine.stats()
    metrics.set("traceless_num_requests_running", s.num_running)
    metrics.set("traceless_num_requests_waiting", s.num_waiting)
    metrics.set("traceless_kv_cache_usage_ratio", s.kv_usage)
    metrics.set_total("traceless_spec_decode_num_draft_tokens_total", s.spec["proposed"])
    metrics.set_total("traceless_spec_decode_num_accepted_tokens_total", s.spec["accepted"])
    metrics.set_total("traceless_spec_decode_num_verify_steps_total", s.spec["verify_steps"])
    r = engine.residue
    if r is not None:
        metrics.set("traceless_kv_blocks_nonzero", r.nonzero_blocks)
        metrics.set("traceless_prefix_cache_blocks", r.cached_blocks)
        metrics.set("traceless_kv_offload_swapped_requests", r.swapped_requests)
