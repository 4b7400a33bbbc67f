"""The gateway's node registry: who serves what, with which attested capacity, and whether it is healthy.

A node registers with {"url", "model", "attestation", "ohttp_keys", "attester_key"} and, when its
attester is hardware-backed, the "evidence" (a JSON list, hardware.evidence_from_json) and the
"base_attestation" it binds, whose key signed the document (privacy/attestation/vouched.py);
admission.py decides whether it is admitted. Records are keyed by the attester
key: one key holds one record (a random 16-byte hex node_id) whatever URLs it names, and
re-registering it (a document by the same key, no older than the last one accepted) refreshes the
URL, attestation, keys and evidence and clears the failure count. Nothing else can replace a
record. The registry holds at most `max_nodes` records; a new key beyond that is refused. A node
that fails `unhealthy_after` consecutive health checks is removed outright; if it comes back it
registers afresh and gets a new id.

Routing sees only `routing_entries()`: (node_id, model, attested capacity, healthy).

The registry is confined to the gateway's event loop (no awaits inside its methods), so it
needs no lock.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from traceless.errors import InvalidRequestError
from traceless.privacy.attestation.collectors import Evidence
from traceless.privacy.attestation.hardware import evidence_from_json, evidence_to_json
from traceless.privacy.attestation.software import AttestationError
from traceless.privacy.errors import MalformedMessageError
from traceless.privacy.ohttp.keys import decode_ohttp_keys
from traceless_tools.cluster.routing import RoutingEntry

MAX_URL_LEN = 2048
MAX_MODEL_LEN = 256
MAX_ATTESTATION_LEN = 64 * 1024
_FIELDS = {"url", "model", "attestation", "ohttp_keys", "attester_key"}
_OPTIONAL = {"evidence", "base_attestation"}


class RegistryFullError(Exception):
    """The registry holds max_nodes records; a new attester key cannot join (HTTP 503)."""


class StaleRegistrationError(Exception):
    """The document is older than the one already accepted for this key (HTTP 409)."""


@dataclass(frozen=True, slots=True)
class NodeRegistration:
    """A well-formed registration request (admission.py decides whether it is admitted). There is
    no capacity field: capacity is read from the attestation, never announced."""

    url: str
    model: str
    attestation: str = field(repr=False)
    ohttp_keys: str = field(repr=False)  # base64 of application/ohttp-keys
    attester_key: str = field(repr=False)  # base64 of the raw Ed25519 key that signs the attestation
    # Hardware evidence, and the base document it binds (None: it binds `attestation` itself).
    evidence: tuple[Evidence, ...] = field(default=(), repr=False)
    base_attestation: str | None = field(default=None, repr=False)

    @classmethod
    def from_json(cls, body: object) -> NodeRegistration:
        if not isinstance(body, dict) or not _FIELDS <= set(body) <= _FIELDS | _OPTIONAL:
            raise InvalidRequestError(
                f"registration must be a JSON object with exactly {sorted(_FIELDS)} and optionally {sorted(_OPTIONAL)}"
            )
        if not isinstance(body["attester_key"], str) or len(body["attester_key"]) > 64:
            raise InvalidRequestError("attester_key must be base64 of a raw Ed25519 public key")
        base = body.get("base_attestation")
        return cls(
            _url(body["url"]),
            _model(body["model"]),
            _attestation(body["attestation"]),
            _ohttp_keys(body["ohttp_keys"]),
            body["attester_key"],
            parse_evidence(body.get("evidence", [])),
            None if base is None else _attestation(base, "base_attestation"),
        )

    def evidence_json(self) -> list[dict[str, str]]:
        return [evidence_to_json(item) for item in self.evidence]


def parse_evidence(value: object) -> tuple[Evidence, ...]:
    """The evidence list a node offers, strictly decoded (InvalidRequestError otherwise)."""
    try:
        return evidence_from_json(value)
    except AttestationError as exc:
        raise InvalidRequestError(f"evidence: {exc}") from None


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


def _attestation(value: object, name: str = "attestation") -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ATTESTATION_LEN:
        raise InvalidRequestError(f"{name} must be a non-empty string of at most {MAX_ATTESTATION_LEN}")
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
    """A registered node: what admission accepted (the attester key, the attested capacity and the
    document's issue time); `failures` counts consecutive failed health checks."""

    node_id: str
    registration: NodeRegistration
    attester_key: bytes
    capacity: int
    issued_at: int
    failures: int = 0

    @property
    def healthy(self) -> bool:
        return self.failures == 0

    def routing_entry(self) -> RoutingEntry:
        return RoutingEntry(self.node_id, self.registration.model, self.capacity, self.healthy)


class NodeRegistry:
    """node_id -> NodeRecord, and attester key -> node_id for re-registration."""

    __slots__ = ("_unhealthy_after", "_max_nodes", "_nodes", "_by_key")

    def __init__(self, unhealthy_after: int, max_nodes: int = 1024) -> None:
        if unhealthy_after < 1 or max_nodes < 1:
            raise ValueError("unhealthy_after and max_nodes must be at least 1")
        self._unhealthy_after = unhealthy_after
        self._max_nodes = max_nodes
        self._nodes: dict[str, NodeRecord] = {}
        self._by_key: dict[bytes, str] = {}

    def register(
        self, registration: NodeRegistration, attester_key: bytes, capacity: int, issued_at: int
    ) -> tuple[str, bool]:
        """(node_id, whether the node is new) for an admitted registration. A known key keeps its id
        and gets the new URL, keys and document, if the document is no older than the last one."""
        node_id = self._by_key.get(attester_key)
        if node_id is None:
            if len(self._nodes) >= self._max_nodes:
                raise RegistryFullError("the registry is full")
            node_id = secrets.token_hex(16)
            self._by_key[attester_key] = node_id
            is_new = True
        else:
            if issued_at < self._nodes[node_id].issued_at:
                raise StaleRegistrationError("the document is older than the one this key registered with")
            is_new = False
        self._nodes[node_id] = NodeRecord(node_id, registration, attester_key, capacity, issued_at)
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
            del self._by_key[record.attester_key]
            return True
        self._nodes[node_id] = replace(record, failures=failures)
        return False

    def drop(self, node_id: str) -> bool:
        """Remove a node now (its check said it cannot serve); returns whether it was there."""
        record = self._nodes.pop(node_id, None)
        if record is None:
            return False
        del self._by_key[record.attester_key]
        return True

    def __len__(self) -> int:
        return len(self._nodes)

    def check_integrity(self) -> None:
        by_key = {record.attester_key: node_id for node_id, record in self._nodes.items()}
        if by_key != self._by_key or len(self._nodes) > self._max_nodes:
            raise RuntimeError("node registry: key index disagrees with the records, or it is over its cap")
