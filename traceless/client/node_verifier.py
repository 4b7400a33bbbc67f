"""Decide whether a candidate node may receive a request: refuse anything unproven, before
anything is sent.

A node passes when
  1. its attestation is signed by a trusted attester key, by an attester type the client's policy
     allows (the software attester only under the explicit development policy), carries the
     client's own nonce (so it was made for this client now: a gateway cannot replay an old one),
     is within its validity period (CLOCK_LEEWAY_S of skew either way), and binds exactly the OHTTP
     keys offered with it;
  2. the measurement it attests is a release in the transparency log (`ReleaseLookup`: proven
     against a signed tree head consistent with every head seen before), and that release allows
     the capacity the document claims.
The capacity the client then draws by is the attested one (node_choice.py).
"""
from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from traceless.events import emit
from traceless.privacy.attestation.policy import AttesterTypeRefusedError, check_attester_type
from traceless.privacy.attestation.software import (
    AttestationError,
    AttestationExpiredError,
    AttestationNotYetValidError,
    BadSignatureError,
    NonceMismatchError,
    OhttpKeyMismatchError,
    UnsupportedEvidenceError,
    UntrustedKeyError,
    document_kid,
    trusted_by_kid,
    verify_attestation,
)
from traceless.privacy.ohttp.errors import OHTTP_ERRORS
from traceless.privacy.ohttp.keys import KeyConfig, decode_ohttp_keys
from traceless.privacy.translog.client import LogClient, LogClientError
from traceless.privacy.translog.release_index import ReleaseIndex, ReleaseLookup, ReleaseNotLoggedError

if TYPE_CHECKING:
    from traceless.client.private_client import ClientConfig


@dataclass(frozen=True, slots=True)
class VerifiedNode:
    node_id: str
    capacity: int  # attested, and allowed by the node's logged release
    key_config: KeyConfig  # the newest of the node's live OHTTP keys
    measurement: bytes
    attester_kid: str
    verified_at: float


class NodeRefused(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_REASONS = ((UntrustedKeyError, "untrusted_key"), (BadSignatureError, "bad_signature"),
            (AttestationExpiredError, "expired"), (AttestationNotYetValidError, "expired"),
            (OhttpKeyMismatchError, "key_mismatch"), (NonceMismatchError, "stale"),
            (AttesterTypeRefusedError, "attester_type"), (UnsupportedEvidenceError, "unsupported_evidence"))


class NodeVerifier:
    """`releases` defaults to a ReleaseIndex over the configured log (tests pass a stub)."""

    def __init__(self, config: ClientConfig, releases: ReleaseLookup | None = None) -> None:
        self._attester_keys = trusted_by_kid(config.attester_keys)
        self._policy = config.attester_policy
        self._leeway_s = config.clock_leeway_s
        self._require_shape = config.require_shape_hiding
        self._log = LogClient(config.log_url, config.log_public_key)
        self._releases = releases if releases is not None else ReleaseIndex(self._log)

    def close(self) -> None:
        self._log.close()

    def verify_all(self, offered: list, expected_nonce: bytes) -> list[VerifiedNode]:
        out = []
        for entry in offered:
            try:
                out.append(self.verify(entry, expected_nonce=expected_nonce))
            except NodeRefused as refused:
                emit("client.refused_node", reason=refused.reason)
        return out

    def verify(self, entry: dict, *, expected_nonce: bytes, now: float | None = None) -> VerifiedNode:
        now = time.time() if now is None else now
        try:
            ohttp_keys = base64.b64decode(entry["ohttp_keys"], validate=True)
            key_config = decode_ohttp_keys(ohttp_keys)[0]  # newest first
            claims = verify_attestation(entry["attestation"], self._attester_keys.values(), now, expected_nonce,
                                        ohttp_keys=ohttp_keys, leeway_s=self._leeway_s)
            check_attester_type(self._policy, claims.attester_type)
            node_id = entry["node_id"]
            if not isinstance(node_id, str):
                raise TypeError("node_id")
        except AttestationError as exc:
            raise NodeRefused(next((r for t, r in _REASONS if isinstance(exc, t)), "malformed")) from None
        except (KeyError, IndexError, ValueError, TypeError, *OHTTP_ERRORS):
            raise NodeRefused("malformed") from None
        combined = claims.measurement.combined
        try:
            release = self._releases.release_for(combined)
        except ReleaseNotLoggedError:
            raise NodeRefused("not_in_log") from None
        except LogClientError:
            raise NodeRefused("log_error") from None
        if not release.allows_capacity(claims.capacity):
            raise NodeRefused("capacity_not_allowed")
        if self._require_shape and release.config.get("shape_padding") != "buckets":
            raise NodeRefused("shape_hiding_off")  # its release sends lengths and timings as they are
        return VerifiedNode(node_id, claims.capacity, key_config, combined, document_kid(entry["attestation"]), now)

