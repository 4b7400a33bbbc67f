"""The only way traceless writes logs: events from a fixed schema.

An event is a name plus fields, and every field is a number, a bool, or one value out of a fixed
set of words declared here (a `Choice`). There is no free-text field anywhere in the schema, so no
prompt, output, token id, header value, client address or exception message can be logged, by
construction: `emit` rejects any field or value the schema does not declare.

Add an event by adding it to SCHEMA, with the narrowest field kinds that carry what an operator
needs (counts, durations, status codes, enumerated reasons).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import dataclass

LOGGER_NAME = "traceless.events"


class EventSchemaError(ValueError):
    """An event or field that the schema does not declare (a programming error)."""


@dataclass(frozen=True, slots=True)
class Choice:
    """A field whose value is one of a fixed set of words."""

    values: frozenset[str]

    @classmethod
    def of(cls, *values: str) -> Choice:
        return cls(frozenset(values))


INT, FLOAT, BOOL = int, float, bool
FieldKind = type | Choice

STATUS = Choice.of("ok", "error", "aborted", "rejected")
FINISH = Choice.of("stop", "length", "abort", "error")
COMPONENT = Choice.of("engine", "server", "node", "gateway", "relay", "issuer", "proxy", "log", "up", "witness")
ERROR_KIND = Choice.of(
    "invalid_request",
    "context_length",
    "queue_full",
    "not_found",
    "too_large",
    "unauthorized",
    "rate_limited",
    "decrypt_failed",
    "token_invalid",
    "token_replayed",
    "upstream",
    "internal",
    "model_error",
    "timeout",
    "unavailable",
)

# Attestation kinds a client can verify a node under (evidence_policy.AttestationVerdict.kind).
ATTESTATION_KIND = Choice.of("software", "snp", "tdx", "nvidia", "snp+nvidia", "tdx+nvidia")
# PolicyRefusedError reasons without their kind and check (evidence_policy.py).
EVIDENCE_REFUSAL = Choice.of(
    "software_attester_refused",
    "malformed",
    "more_than_one_cpu_report",
    "cpu_evidence_missing",
    "gpu_evidence_missing",
    "cpu_kind_not_accepted",
    "gpu_evidence_not_required",
    "report_failed",
    "check_not_run",
    "report_malformed",
    "no_trust_anchor",
    "attester_type",
    "other",
)
# Every check name of the SEV-SNP, TDX and NVIDIA verifiers (their CHECKS), and "none".
EVIDENCE_CHECK = Choice.of(
    "none",
    "report-format",
    "cert-chain",
    "report-signature",
    "tcb-binding",
    "minimum-tcb",
    "guest-policy",
    "measurement",
    "report-data",
    "revocation",
    "quote-format",
    "pck-chain",
    "qe-report-signature",
    "qe-binding",
    "quote-signature",
    "collateral-signatures",
    "collateral-current",
    "tcb-status",
    "td-attributes",
    "mr-td",
    "rtmrs",
    "fwid-binding",
    "nonce",
    "reference-measurements",
    "rim-signature",
    "host-data",
    "mr-config-id",
)

SCHEMA: dict[str, dict[str, FieldKind]] = {
    # engine
    "engine.ready": {
        "device": Choice.of("cpu", "cuda"),
        "dtype": Choice.of("float32", "bfloat16", "float16"),
        "num_blocks": INT,
        "block_size": INT,
        "max_model_len": INT,
        "load_s": FLOAT,
        "attention": Choice.of("native", "torch", "triton"),
        "load_format": Choice.of("auto", "dummy"),
        "cuda_graphs": INT,
        "capture_s": FLOAT,
        "kv_cache_bytes": INT,
        "kv_cache_dtype": Choice.of("float32", "bfloat16", "float16"),
        "kv_sized_by": Choice.of("kv_cache_memory", "max_model_len", "gpu_memory_utilization"),
    },
    "engine.step_failed": {"num_requests": INT, "error_kind": ERROR_KIND},
    "engine.preempted": {"num_requests": INT, "spilled": INT},  # spilled: of them, sealed into the offload
    "engine.kv_restore_failed": {"num_requests": INT},
    "engine.kv_spill_failed": {"num_requests": INT},
    "engine.restarted": {"restarts": INT},
    "engine.stopped": {"restarts": INT},
    "engine.grammar_rejected_token": {},
    # only with --request-events (a benchmark's switch, off by default): exact per-request figures
    "request.finished": {
        "finish": FINISH,
        "prompt_tokens": INT,
        "output_tokens": INT,
        "ttft_s": FLOAT,
        "e2e_s": FLOAT,
    },
    # telemetry: one event per closed window of many requests (server/telemetry.py), never per request
    "metrics.window": {
        "requests": INT,
        "ok": INT,
        "rejected": INT,
        "error": INT,
        "aborted": INT,
        "prompt_tokens": INT,
        "output_tokens": INT,
        "ttft_p50_s": FLOAT,
        "e2e_p50_s": FLOAT,
    },
    # services
    "service.started": {"component": COMPONENT, "port": INT, "listener": Choice.of("public", "operator")},
    "service.stopped": {"component": COMPONENT},
    # Ctrl-C or SIGTERM: new connections refused, open requests may run on for drain_s (http/shutdown.py)
    "service.stopping": {"component": COMPONENT, "drain_s": FLOAT},
    "service.ending_requests": {"component": COMPONENT, "reason": Choice.of("drain_timed_out", "second_signal")},
    "http.request": {
        "component": COMPONENT,
        "route": Choice.of(
            "models",
            "completions",
            "chat_completions",
            "tokenize",
            "detokenize",
            "tokenizer_info",
            "health",
            "metrics",
            "attestation",
            "ohttp_keys",
            "ohttp",
            "nodes",
            "register",
            "token",
            "log",
            "other",
            "challenge",
            "token_directory",
            "token_batch",
            "status",
        ),
        "status_code": INT,
        "duration_s": FLOAT,
        "stream": BOOL,
    },
    "http.error": {"component": COMPONENT, "status_code": INT, "error_kind": ERROR_KIND},
    # private path
    "node.registered": {"ok": BOOL, "status_code": INT},
    "node.replay_refused": {"replay_entries": INT},
    "node.evidence_unavailable": {"route": Choice.of("attestation", "register")},
    "node.evidence_capped": {"route": Choice.of("attestation", "register")},
    "client.refused_node": {
        "reason": Choice.of(
            "untrusted_key",
            "bad_signature",
            "expired",
            "malformed",
            "key_mismatch",
            "not_in_log",
            "log_error",
            "stale",
            "attester_type",
            "capacity_not_allowed",
            "unsupported_evidence",
            "evidence_refused",
            "evidence_without_policy",
            "log_unwitnessed",
            "log_stale",
            "log_inconsistent",
            "release_prefix_cache",
            "release_unpadded",
            "release_unscrubbed",
            "release_dummy_weights",
            "release_request_events",
            "duplicate_listing",
            "base_mismatch",
        )
    },
    # `reason` is the policy's fixed refusal code; for a report that failed, `kind` and `check` name it
    "client.evidence_refused": {
        "reason": EVIDENCE_REFUSAL,
        "kind": Choice.of("snp", "tdx", "nvidia", "none"),
        "check": EVIDENCE_CHECK,
    },
    "client.attestation_kind": {"kind": ATTESTATION_KIND},
    "client.candidates": {"offered": INT, "verified": INT, "fresh": BOOL},
    "client.request": {"ok": BOOL, "attempts": INT, "stream": BOOL},
    "client.tokens_refilled": {"tokens": INT},
    "client.tokens_refused": {
        "reason": Choice.of(
            "issuer_error",
            "unreachable",
            "timeout",
            "challenge_mismatch",
            "issuer_key_not_logged",
            "issuer_key_not_newest",
            "quota_exhausted",
            "api_key_refused",
        )
    },
    # cluster: issuer, gateway, relay (counts only: no node ids, urls, users or addresses)
    "gateway.configured": {
        "token_check": BOOL,
        "issuer_keys": INT,
        "health_interval_s": FLOAT,
        "unhealthy_after": INT,
        "attester_policy": Choice.of("production", "development"),
        "evidence_policy": BOOL,
    },
    "gateway.node_registered": {"new": BOOL, "nodes": INT},
    "gateway.issuer_keys": {"ok": BOOL, "changed": BOOL, "keys": INT},
    "gateway.node_dropped": {
        "failures": INT,
        "nodes": INT,
        "reason": Choice.of("unhealthy", "engine_dead", "unreachable"),
    },
    "gateway.streams_cut": {"streams": INT},
    "gateway.registration_refused": {
        "reason": Choice.of(
            "attestation_refused",
            "release_not_logged",
            "capacity_not_allowed",
            "stale_registration",
            "registry_full",
            "log_error",
            "evidence_refused",
        )
    },
    "issuer.issued": {"tokens": INT},
    # transparency log
    "log.opened": {"tree_size": INT},
    "log.appended": {"tree_size": INT},
    "log.recovered": {"dropped_bytes": INT},
    "log.verified": {
        "result": Choice.of(
            "ok",
            "bad_signature",
            "key_mismatch",
            "inconsistent",
            "root_mismatch",
            "bad_proof",
            "protocol",
            "unreachable",
            "no_cosignature",
            "stale",
        ),
        "tree_size": INT,
    },
    "log.cosignature_accepted": {"tree_size": INT},
    # witness (privacy/translog/witness.py): cosigned a head, or refused to / could not hand it in
    "witness.cosigned": {"tree_size": INT},
    "witness.refused": {
        "reason": Choice.of(
            "inconsistent",
            "bad_signature",
            "key_mismatch",
            "root_mismatch",
            "bad_proof",
            "protocol",
            "unreachable",
            "rejected",
        )
    },
}


def _check(event: str, fields: dict[str, object]) -> None:
    try:
        schema = SCHEMA[event]
    except KeyError:
        raise EventSchemaError(f"unknown event {event!r}") from None
    for name, value in fields.items():
        kind = schema.get(name)
        if kind is None:
            raise EventSchemaError(f"event {event!r} has no field {name!r}")
        if isinstance(kind, Choice):
            ok = isinstance(value, str) and value in kind.values
        elif kind is BOOL:
            ok = isinstance(value, bool)
        elif kind is INT:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok:
            raise EventSchemaError(f"event {event!r}: field {name!r} does not fit its declared kind")


def emit(event: str, **fields: object) -> None:
    """Log one event as a JSON line on the `traceless.events` logger."""
    _check(event, fields)
    logger = logging.getLogger(LOGGER_NAME)
    if logger.isEnabledFor(logging.INFO):
        record = {"ts": round(time.time(), 3), "event": event, **fields}
        logger.info(json.dumps(record, separators=(",", ":")))


def configure_logging(level: int = logging.INFO) -> None:
    """Send events to stderr, one JSON object per line, and nothing else.

    Third-party loggers (uvicorn, httpx, asyncio) can record addresses, paths and exception text,
    so they are silenced: only the event logger reaches the handler.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.CRITICAL + 1)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "httpx", "httpcore", "asyncio"):
        other = logging.getLogger(name)
        other.handlers.clear()
        other.propagate = False
        other.disabled = True
    events = logging.getLogger(LOGGER_NAME)
    events.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    events.addHandler(handler)
    events.setLevel(level)
    events.propagate = False
