"""The gateway's node registry: who serves what, with which capacity, and whether it is healthy.

A node registers with {"url", "model", "capacity", "attestation", "ohttp_keys"} and gets a
random 16-byte hex node_id. The id stays the same for that url while the node is registered;
re-registering refreshes everything else (attestation, keys, model, capacity) and clears its
failure count. A node that fails `unhealthy_after` consecutive health checks is removed
outright; if it comes back it registers afresh and gets a new id.

Routing sees only `routing_entries()`: (node_id, model, capacity, healthy), where healthy
means its last health check passed. A node that failed a check is not offered to clients
until it passes again, but it keeps its id until the threshold drops it.

The registry is confined to the gateway's event loop (no awaits inside its methods), so it
needs no lock.
"""
from __future__ import annotations

import base64
import binascii
import math
import secrets
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from traceless.cluster.routing import RoutingEntry
from traceless.errors import InvalidRequestError
from traceless.privacy.errors import MalformedMessageError
from traceless.privacy.ohttp.keys import decode_ohttp_keys

MAX_URL_LEN = 2048
MAX_MODEL_LEN = 256
MAX_ATTESTATION_LEN = 64 * 1024
MAX_CAPACITY = 1e9
_FIELDS = {"url", "model", "capacity", "attestation", "ohttp_keys"}


@dataclass(frozen=True, slots=True)
class NodeRegistration:
    """A validated registration request. Attestation and keys are opaque to the gateway: it
    only passes them to clients, who verify them."""

    url: str
    model: str
    capacity: float
    attestation: str = field(repr=False)
    ohttp_keys: str = field(repr=False)  # base64 of application/ohttp-keys

    @classmethod
    def from_json(cls, body: object) -> NodeRegistration:
        if not isinstance(body, dict) or set(body) != _FIELDS:
            raise InvalidRequestError(f"registration must be a JSON object with exactly {sorted(_FIELDS)}")
        return cls(_url(body["url"]), _model(body["model"]), _capacity(body["capacity"]),
                   _attestation(body["attestation"]), _ohttp_keys(body["ohttp_keys"]))


def _url(value: object) -> str:
    if not isinstance(value, str) or not value.isascii() or len(value) > MAX_URL_LEN:
        raise InvalidRequestError("url must be an http(s) URL")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise InvalidRequestError("url must be an http(s) URL with a host and no query")
    return value.rstrip("/")


def _model(value: object) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_MODEL_LEN or not value.isprintable():
        raise InvalidRequestError(f"model must be a printable string of 1..{MAX_MODEL_LEN} characters")
    return value


def _capacity(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError("capacity must be a number")
    if not (math.isfinite(value) and 0 < value <= MAX_CAPACITY):
        raise InvalidRequestError(f"capacity must be positive and at most {MAX_CAPACITY:g}")
    return value


def _attestation(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ATTESTATION_LEN:
        raise InvalidRequestError(f"attestation must be a non-empty string of at most {MAX_ATTESTATION_LEN}")
    return value


def _ohttp_keys(value: object) -> str:
    try:
        if not isinstance(value, str):
            raise ValueError("not a string")
        decode_ohttp_keys(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError, MalformedMessageError):
        raise InvalidRequestError("ohttp_keys must be base64 of an application/ohttp-keys body") from None
    return value


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A registered node; `failures` counts consecutive failed health checks."""

    node_id: str
    registration: NodeRegistration
    failures: int = 0

    @property
    def healthy(self) -> bool:
        return self.failures == 0

    def routing_entry(self) -> RoutingEntry:
        reg = self.registration
        return RoutingEntry(self.node_id, reg.model, reg.capacity, self.healthy)


class NodeRegistry:
    """node_id -> NodeRecord, and url -> node_id for re-registration."""

    __slots__ = ("_unhealthy_after", "_nodes", "_by_url")

    def __init__(self, unhealthy_after: int) -> None:
        if unhealthy_after < 1:
            raise ValueError("unhealthy_after must be at least 1")
        self._unhealthy_after = unhealthy_after
        self._nodes: dict[str, NodeRecord] = {}
        self._by_url: dict[str, str] = {}

    def register(self, registration: NodeRegistration) -> tuple[str, bool]:
        """(node_id, whether the node is new). A known url keeps its id; all else is replaced."""
        node_id = self._by_url.get(registration.url)
        is_new = node_id is None
        if node_id is None:
            node_id = secrets.token_hex(16)
            self._by_url[registration.url] = node_id
        self._nodes[node_id] = NodeRecord(node_id, registration)
        return node_id, is_new

    def get(self, node_id: str) -> NodeRecord | None:
        return self._nodes.get(node_id)

    def records(self) -> list[NodeRecord]:
        return list(self._nodes.values())

    def routing_entries(self) -> list[RoutingEntry]:
        return [record.routing_entry() for record in self._nodes.values()]

    def record_health(self, node_id: str, ok: bool) -> bool:
        """Count one health check; returns True if it made the node drop out."""
        record = self._nodes.get(node_id)
        if record is None:
            return False  # dropped or replaced while the check was in flight
        failures = 0 if ok else record.failures + 1
        if failures >= self._unhealthy_after:
            del self._nodes[node_id]
            del self._by_url[record.registration.url]
            return True
        self._nodes[node_id] = replace(record, failures=failures)
        return False

    def __len__(self) -> int:
        return len(self._nodes)

    def check_integrity(self) -> None:
        by_url = {record.registration.url: node_id for node_id, record in self._nodes.items()}
        if by_url != self._by_url:
            raise RuntimeError("node registry: url index disagrees with the records")
