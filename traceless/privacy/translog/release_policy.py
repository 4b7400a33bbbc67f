"""What a logged release must say before a client sends it anything.

A release manifest states a node's whole measured configuration in readable form
(`traceless.cli.node.node_measured_config`). Being in the log only proves that the release is
public; this policy decides whether it is one the client will use. A release is refused, with a
reason, unless it says:

    prefix_cache        "isolated" or "off"   (never "global": that shares KV across users)
    shape_padding       "buckets"             (requests, responses and stream chunks padded to size
                                               buckets, streams paced: docs/shape-hiding.md)
    scrub_freed_memory  true                  (freed host memory is zeroed)
    load_format         not "dummy"           (real, measured weights)
    request_events      false                 (no per-request figures in the node's event log)
    metrics_epsilon     a number, at most the policy's `max_metrics_epsilon` (default 1.0): the
                                              noise on the node's telemetry windows (docs/telemetry.md);
                                              never off (exact figures)

A setting missing from the manifest counts as not shown, so it is refused as well. Three of these
are the benchmarks' switches (padding costs bandwidth, per-request events feed the privacy-tax
breakdown, dummy weights give real model shapes without a download); `ReleasePolicy` can waive
exactly those three, and only where a deployment says so loudly (`traceless proxy
--allow-unpadded-releases / --allow-request-events-releases / --allow-dummy-weights-releases`,
which `traceless up` passes only when its own nodes need them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from traceless.errors import TracelessError


class ReleaseRefusedError(TracelessError):
    """The logged release does not say what the client's policy requires; `reason` is one word."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ReleasePolicy:
    allow_unpadded: bool = False  # benchmark-only waiver: shape_padding not "buckets"
    allow_request_events: bool = False  # benchmark-only waiver: request_events true
    allow_dummy_weights: bool = False  # benchmark-only waiver: load_format "dummy"
    max_metrics_epsilon: float = 1.0  # the most privacy loss per telemetry window a node may have

    @classmethod
    def waiving_for(cls, config: Mapping[str, Any]) -> ReleasePolicy:
        """The policy with exactly the waivers a release of this configuration needs."""
        return cls(
            allow_unpadded=config.get("shape_padding") != "buckets",
            allow_request_events=config.get("request_events") is True,
            allow_dummy_weights=config.get("load_format") == "dummy",
        )

    @classmethod
    def from_waivers(cls, waivers: Iterable[str]) -> ReleasePolicy:
        """The policy with the named waivers ("unpadded", "request_events", "dummy_weights")."""
        names = set(waivers)
        if names - {"unpadded", "request_events", "dummy_weights"}:
            raise ValueError("unknown release policy waiver")
        return cls("unpadded" in names, "request_events" in names, "dummy_weights" in names)

    @property
    def waivers(self) -> tuple[str, ...]:
        return tuple(
            name
            for name, on in (
                ("unpadded", self.allow_unpadded),
                ("request_events", self.allow_request_events),
                ("dummy_weights", self.allow_dummy_weights),
            )
            if on
        )


def check_release(policy: ReleasePolicy, config: Mapping[str, Any]) -> None:
    """Raise ReleaseRefusedError (reason: release_<setting>) unless `config` passes the policy."""
    if config.get("prefix_cache") not in ("isolated", "off"):
        raise ReleaseRefusedError("release_prefix_cache", "the release does not isolate its prefix cache")
    if not policy.allow_unpadded and config.get("shape_padding") != "buckets":
        raise ReleaseRefusedError("release_unpadded", "the release does not pad its responses")
    if config.get("scrub_freed_memory") is not True:
        raise ReleaseRefusedError("release_unscrubbed", "the release does not scrub freed memory")
    load_format = config.get("load_format")
    if not isinstance(load_format, str) or (load_format == "dummy" and not policy.allow_dummy_weights):
        raise ReleaseRefusedError("release_dummy_weights", "the release does not load real weights")
    if not policy.allow_request_events and config.get("request_events") is not False:
        raise ReleaseRefusedError("release_request_events", "the release logs per-request events")
    eps = config.get("metrics_epsilon")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps <= policy.max_metrics_epsilon:
        raise ReleaseRefusedError(
            "release_metrics_epsilon", "the release's telemetry noise is off or weaker than the client allows"
        )
