"""Decide whether a candidate node may receive a request: refuse anything unproven, before
anything is sent.

A node passes when (1) its attestation is signed by a trusted attester key, is within its validity
period, and binds exactly the OHTTP key configuration offered with it, and (2) the measurement it
attests is included in the transparency log, proven against a signed tree head that is consistent
with every tree head this client has seen before. Proven measurements are remembered: the log is
append-only, and every later tree head is checked for consistency with the earlier ones.
"""
from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from traceless.events import emit
from traceless.privacy.attestation.software import (
    AttestationError,
    AttestationExpiredError,
    AttestationNotYetValidError,
    BadSignatureError,
    OhttpKeyMismatchError,
    UntrustedKeyError,
    verify_attestation,
)
from traceless.privacy.ohttp.errors import OHTTP_ERRORS
from traceless.privacy.ohttp.keys import KeyConfig, decode_ohttp_keys
from traceless.privacy.translog.client import InclusionProofError, LogClient, LogClientError, measurement_leaf
from traceless.privacy.translog.merkle import leaf_hash

if TYPE_CHECKING:
    from traceless.client.private_client import ClientConfig

STH_REFRESH_S = 30.0


@dataclass(frozen=True, slots=True)
class VerifiedNode:
    node_id: str
    capacity: int
    key_config: KeyConfig
    measurement: bytes


class NodeRefused(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_REASONS = ((UntrustedKeyError, "untrusted_key"), (BadSignatureError, "bad_signature"),
            (AttestationExpiredError, "expired"), (AttestationNotYetValidError, "expired"),
            (OhttpKeyMismatchError, "key_mismatch"))


class NodeVerifier:
    def __init__(self, config: ClientConfig) -> None:
        self._attester_keys = config.attester_keys
        self._log = LogClient(config.log_url, config.log_public_key)
        self._proven: set[bytes] = set()
        self._sth_checked_at = 0.0

    def close(self) -> None:
        self._log.close()

    def verify_all(self, offered: list[dict]) -> list[VerifiedNode]:
        out = []
        for entry in offered:
            try:
                out.append(self.verify(entry))
            except NodeRefused as refused:
                emit("client.refused_node", reason=refused.reason)
        return out

    def verify(self, entry: dict, now: float | None = None) -> VerifiedNode:
        now = time.time() if now is None else now
        try:
            configs = decode_ohttp_keys(base64.b64decode(entry["ohttp_keys"], validate=True))
            key_config = configs[0]
            claims = verify_attestation(entry["attestation"], self._attester_keys, now,
                                        ohttp_key_config=key_config.encode())
            node_id, capacity = str(entry["node_id"]), int(entry.get("capacity", 1))
        except AttestationError as exc:
            raise NodeRefused(next((r for t, r in _REASONS if isinstance(exc, t)), "malformed")) from None
        except (KeyError, IndexError, ValueError, TypeError, *OHTTP_ERRORS):
            raise NodeRefused("malformed") from None
        combined = claims.measurement.combined
        self._prove(combined, now)
        return VerifiedNode(node_id, capacity, key_config, combined)

    def _prove(self, combined: bytes, now: float) -> None:
        try:
            if now - self._sth_checked_at > STH_REFRESH_S or combined not in self._proven:
                sth = self._log.update()  # signature + consistency with the last head seen
                self._sth_checked_at = now
                if combined not in self._proven:
                    self._log.prove_inclusion(leaf_hash(measurement_leaf(combined)), sth)
                    self._proven.add(combined)
        except InclusionProofError:
            raise NodeRefused("not_in_log") from None
        except LogClientError:
            raise NodeRefused("log_error") from None
