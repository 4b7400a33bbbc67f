"""Decide whether a candidate node may receive a request: refuse anything unproven, before
anything is sent.

A node passes when
  1. its attestation is signed by a trusted attester key, by an attester type the client's policy
     allows (the software attester only under the explicit development policy), carries the
     client's own nonce (so it was made for this client now: a gateway cannot replay an old one),
     is within its validity period (CLOCK_LEEWAY_S of skew either way), and binds exactly the OHTTP
     keys offered with it;
  2. the measurement it attests is a release in the transparency log (`ReleaseLookup`: proven
     against a signed tree head consistent with every head seen before, this client's saved one
     included, and cosigned recently by a witness the client trusts), the release's settings pass
     the client's release policy (release_policy.py: isolated prefix cache, padding, scrubbing, real
     weights, no per-request events), and that release allows the capacity the document claims.
The capacity the client then draws by is the attested one (node_choice.py).
"""
from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from pathlib import Path
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
from traceless.privacy.translog.cosignature import WitnessPolicy
from traceless.privacy.translog.manifest import IssuerKeyEntry
from traceless.privacy.translog.release_index import ReleaseIndex, ReleaseLookup, ReleaseNotLoggedError
from traceless.privacy.translog.release_policy import ReleaseRefusedError, check_release

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


_LOG_REASONS = {"no_cosignature": "log_unwitnessed", "stale": "log_stale", "inconsistent": "log_inconsistent"}


def client_state_path(config: ClientConfig) -> Path | None:
    """The file holding the client's last verified tree head (its directory made 0700), if any."""
    if config.state_dir is None:
        return None
    directory = Path(config.state_dir)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    return directory / "log-state.json"


class NodeVerifier:
    """`releases` defaults to a ReleaseIndex over the configured log (tests pass a stub)."""

    def __init__(self, config: ClientConfig, releases: ReleaseLookup | None = None) -> None:
        self._attester_keys = trusted_by_kid(config.attester_keys)
        self._policy = config.attester_policy
        self._release_policy = config.release_policy
        self._leeway_s = config.clock_leeway_s
        self._log = LogClient(config.log_url, config.log_public_key, state_path=client_state_path(config),
                              witness=WitnessPolicy(config.witness_keys, config.max_tree_head_age_s))
        self._index = ReleaseIndex(self._log)
        self._releases = releases if releases is not None else self._index

    def logged_issuer_keys(self, issuer: str, refresh: bool = False) -> list[IssuerKeyEntry]:
        """The issuer key entries in the log (the same witnessed, consistency-checked view as releases)."""
        return self._index.issuer_keys(issuer, refresh=refresh)

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
        except LogClientError as exc:
            raise NodeRefused(_LOG_REASONS.get(exc.result, "log_error")) from None
        try:
            check_release(self._release_policy, release.config)
        except ReleaseRefusedError as exc:
            raise NodeRefused(exc.reason) from None
        if not release.allows_capacity(claims.capacity):
            raise NodeRefused("capacity_not_allowed")
        return VerifiedNode(node_id, claims.capacity, key_config, combined, document_kid(entry["attestation"]), now)

