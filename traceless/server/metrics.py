"""Prometheus metrics from an explicit allowlist.

Every metric name, label name and label value is declared here; observing anything else raises.
Values are counts, durations and ratios, so the exposition can carry no user content.
"""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

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


SPECS = (
    Spec("traceless_requests_total", "counter", "Requests by endpoint and outcome.", {"endpoint": ENDPOINT, "status": STATUS}),
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
    Spec("traceless_spec_decode_num_draft_tokens_total", "counter", "Speculative draft tokens sent to verification."),
    Spec("traceless_spec_decode_num_accepted_tokens_total", "counter", "Speculative draft tokens accepted."),
    Spec("traceless_spec_decode_num_verify_steps_total", "counter",
         "(request, step) pairs that verified at least one draft token."),
)


class UnknownMetric(ValueError):
    pass


class Metrics:
    def __init__(self, specs: tuple[Spec, ...] = SPECS):
        self._specs = {s.name: s for s in specs}
        self._values: dict[tuple[str, tuple[str, ...]], float] = {}
        self._hist: dict[str, tuple[list[int], list[float]]] = {
            s.name: ([0] * (len(s.buckets) + 1), [0.0]) for s in specs if s.kind == "histogram"
        }
        self._lock = threading.Lock()

    def _key(self, name: str, kind: str, labels: dict[str, str]) -> tuple[str, tuple[str, ...]]:
        spec = self._specs.get(name)
        if spec is None or spec.kind != kind:
            raise UnknownMetric(f"{name} is not an allowlisted {kind}")
        if set(labels) != set(spec.labels):
            raise UnknownMetric(f"{name} takes labels {sorted(spec.labels)}")
        for k, v in labels.items():
            if v not in spec.labels[k]:
                raise UnknownMetric(f"{name}: label {k} has no allowlisted value for this observation")
        return name, tuple(labels[k] for k in sorted(spec.labels))

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = self._key(name, "counter", labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def set(self, name: str, value: float) -> None:
        key = self._key(name, "gauge", {})
        with self._lock:
            self._values[key] = float(value)

    def set_total(self, name: str, value: float) -> None:
        """A counter kept by its owner (the engine) and mirrored here at scrape time."""
        key = self._key(name, "counter", {})
        with self._lock:
            self._values[key] = float(value)

    def observe(self, name: str, value: float) -> None:
        self._key(name, "histogram", {})
        spec = self._specs[name]
        counts, total = self._hist[name]
        with self._lock:
            counts[bisect.bisect_left(spec.buckets, value)] += 1
            total[0] += value

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for spec in self._specs.values():
                lines += [f"# HELP {spec.name} {spec.help}", f"# TYPE {spec.name} {spec.kind}"]
                if spec.kind == "histogram":
                    lines += self._render_histogram(spec)
                    continue
                for (name, values), v in sorted(self._values.items()):
                    if name == spec.name:
                        label = ",".join(f'{k}="{x}"' for k, x in zip(sorted(spec.labels), values))
                        lines.append(f"{name}{{{label}}} {v:g}" if label else f"{name} {v:g}")
        return "\n".join(lines) + "\n"

    def _render_histogram(self, spec: Spec) -> list[str]:
        counts, total = self._hist[spec.name]
        out, cumulative = [], 0
        for bound, c in zip((*spec.buckets, float("inf")), counts):
            cumulative += c
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{spec.name}_bucket{{le="{le}"}} {cumulative}')
        out += [f"{spec.name}_sum {total[0]:g}", f"{spec.name}_count {cumulative}"]
        return out


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
