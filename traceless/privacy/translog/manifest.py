"""The transparency log's leaves: readable entries, hashed into the tree as they are.

A leaf is the canonical JSON (sorted keys, no whitespace, UTF-8) of one entry:

    release     {"schema": "traceless/release/v1", "code": hex, "model": hex, "config": {...},
                 "combined": hex, "capacities": [int, ...]}
                what a node of this release runs: the code and model digests, its whole measured
                configuration in readable form (privacy settings included: anyone can read from the
                log what a release does), the combined measurement nodes attest, and the capacity
                classes a node of this release may claim.
    issuer key  {"schema": "traceless/issuer-key/v1", "issuer": name, "token_key": b64url SPKI,
                 "not_before": s, "not_after": s}
                a Privacy Pass issuer key every client may use in that window; one key for everyone
                is checkable only if it is public and append-only.

Decoding is strict: exact keys, exact types, and a release's `combined` must be what its parts
hash to, so a leaf cannot say one thing to a reader and attest another.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from traceless.errors import TracelessError
from traceless.privacy.attestation.measurement import HASH_SIZE, Measurement, canonical_json, config_digest

RELEASE_SCHEMA = "traceless/release/v1"
ISSUER_KEY_SCHEMA = "traceless/issuer-key/v1"
MAX_LEAF_BYTES = 64 * 1024
MAX_CAPACITY = 1_000_000


class ManifestError(TracelessError, ValueError):
    """A leaf that is not a well-formed entry (the message names the field, never its value)."""


def _digest(entry: Mapping[str, Any], key: str) -> bytes:
    value = entry.get(key)
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != HASH_SIZE or value != raw.hex():
        raise ManifestError(f"'{key}' must be a 32-byte digest in lowercase hex")
    return raw


def _int(entry: Mapping[str, Any], key: str, low: int, high: int) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ManifestError(f"'{key}' must be an integer in [{low}, {high}]")
    return value


def _keys(entry: Mapping[str, Any], expected: set[str]) -> None:
    if set(entry) != expected:
        raise ManifestError(
            f"an entry of schema {entry.get('schema')!r} has exactly the keys {sorted(expected)}"
            if entry.get("schema") in (RELEASE_SCHEMA, ISSUER_KEY_SCHEMA)
            else "unknown entry schema"
        )


@dataclass(frozen=True, slots=True)
class ReleaseManifest:
    code: bytes
    model: bytes
    config: Mapping[str, Any]
    capacities: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.code) != HASH_SIZE or len(self.model) != HASH_SIZE:
            raise ManifestError("code and model digests are 32 bytes")
        if (
            not self.capacities
            or any(not 1 <= c <= MAX_CAPACITY for c in self.capacities)
            or list(self.capacities) != sorted(set(self.capacities))
        ):
            raise ManifestError(f"capacities must be distinct, ascending integers in [1, {MAX_CAPACITY}]")
        config_digest(self.config)  # JSON data only

    @property
    def measurement(self) -> Measurement:
        return Measurement(self.code, self.model, config_digest(self.config))

    @property
    def combined(self) -> bytes:
        return self.measurement.combined

    def allows_capacity(self, capacity: int) -> bool:
        return capacity in self.capacities

    def encode(self) -> bytes:
        return canonical_json(
            {
                "schema": RELEASE_SCHEMA,
                "code": self.code.hex(),
                "model": self.model.hex(),
                "config": dict(self.config),
                "combined": self.combined.hex(),
                "capacities": list(self.capacities),
            }
        )

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> ReleaseManifest:
        _keys(entry, {"schema", "code", "model", "config", "combined", "capacities"})
        config, caps = entry["config"], entry["capacities"]
        if not isinstance(config, dict):
            raise ManifestError("'config' must be a JSON object")
        if not isinstance(caps, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in caps):
            raise ManifestError("'capacities' must be a list of integers")
        manifest = cls(_digest(entry, "code"), _digest(entry, "model"), config, tuple(caps))
        if manifest.combined != _digest(entry, "combined"):
            raise ManifestError("'combined' is not the combined measurement of the entry's parts")
        return manifest


@dataclass(frozen=True, slots=True)
class IssuerKeyEntry:
    issuer: str
    token_key: bytes  # DER SubjectPublicKeyInfo (RFC 9578 section 6.5)
    not_before: int
    not_after: int

    def __post_init__(self) -> None:
        if not self.issuer or len(self.issuer) > 255 or not self.token_key or not self.not_before < self.not_after:
            raise ManifestError("an issuer key entry needs an issuer name, a key and not_before < not_after")

    def valid_at(self, now: float) -> bool:
        return self.not_before <= now < self.not_after

    def encode(self) -> bytes:
        key = base64.urlsafe_b64encode(self.token_key).rstrip(b"=").decode()
        return canonical_json(
            {
                "schema": ISSUER_KEY_SCHEMA,
                "issuer": self.issuer,
                "token_key": key,
                "not_before": self.not_before,
                "not_after": self.not_after,
            }
        )

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> IssuerKeyEntry:
        _keys(entry, {"schema", "issuer", "token_key", "not_before", "not_after"})
        issuer, key = entry["issuer"], entry["token_key"]
        if not isinstance(issuer, str) or not isinstance(key, str):
            raise ManifestError("'issuer' and 'token_key' must be strings")
        try:
            raw = base64.urlsafe_b64decode(key + "=" * (-len(key) % 4))
        except (binascii.Error, ValueError):
            raise ManifestError("'token_key' must be base64url") from None
        return cls(issuer, raw, _int(entry, "not_before", 0, 2**53), _int(entry, "not_after", 0, 2**53))


LogEntry = ReleaseManifest | IssuerKeyEntry


def decode_leaf(leaf: bytes) -> LogEntry:
    """The entry a leaf holds; ManifestError unless it is exactly the canonical encoding of one."""
    if len(leaf) > MAX_LEAF_BYTES:
        raise ManifestError(f"a leaf holds at most {MAX_LEAF_BYTES} bytes")
    try:
        entry = json.loads(leaf)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ManifestError("a leaf is canonical JSON") from None
    if not isinstance(entry, dict):
        raise ManifestError("a leaf is a JSON object")
    schema = entry.get("schema")
    decoded: LogEntry
    if schema == RELEASE_SCHEMA:
        decoded = ReleaseManifest.from_entry(entry)
    elif schema == ISSUER_KEY_SCHEMA:
        decoded = IssuerKeyEntry.from_entry(entry)
    else:
        raise ManifestError("unknown entry schema")
    if decoded.encode() != leaf:
        raise ManifestError("a leaf must be the canonical encoding of its entry")
    return decoded
