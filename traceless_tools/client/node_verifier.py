"""Decide whether a candidate node may receive a request: refuse anything unproven, before
anything is sent.

A node passes when
  1. its attestation is signed by a trusted attester key, by an attester type the client's policy
     allows (the software attester only under the explicit development policy), carries the
     client's own nonce (so it was made for this client now: a gateway cannot replay an old one),
     is within its validity period (CLOCK_LEEWAY_S of skew either way), and binds exactly the OHTTP
     keys offered with it. With an evidence policy (`ClientConfig.evidence_policy`), the key is
     trusted only once the hardware evidence offered beside the document verifies under that
     policy and binds the document, or the base document offered with it (`check_evidence`): then
     it is the key the evidence vouches for (`document_key`), and a fresh document over a base must
     be by that key and restate the base's measurement, keys, capacity and URL (`verify_with_base`);
     the software attester passes only a policy that allows it, under a pinned key. Without an
     evidence policy, evidence is refused, never ignored;
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
from typing import TYPE_CHECKING, NoReturn

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from traceless.events import EVIDENCE_CHECK, EVIDENCE_REFUSAL, Choice, emit
from traceless.privacy.attestation.collectors import Evidence
from traceless.privacy.attestation.evidence_policy import SOFTWARE, PolicyRefusedError, check_evidence
from traceless.privacy.attestation.hardware import HardwareAttester, evidence_from_json
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
)
from traceless.privacy.attestation.vouched import BaseMismatchError, evidence_bound, verify_with_base
from traceless.privacy.ohttp.errors import OHTTP_ERRORS
from traceless.privacy.ohttp.keys import KeyConfig, decode_ohttp_keys
from traceless.privacy.translog.client import LogClient, LogClientError
from traceless.privacy.translog.cosignature import WitnessPolicy
from traceless.privacy.translog.manifest import IssuerKeyEntry
from traceless.privacy.translog.release_index import ReleaseIndex, ReleaseLookup, ReleaseNotLoggedError
from traceless.privacy.translog.release_policy import ReleaseRefusedError, check_release

if TYPE_CHECKING:
    from traceless_tools.client.private_client import ClientConfig


@dataclass(frozen=True, slots=True)
class VerifiedNode:
    node_id: str
    capacity: int  # attested, and allowed by the node's logged release
    key_config: KeyConfig  # the newest of the node's live OHTTP keys
    measurement: bytes
    attester_kid: str
    verified_at: float
    attestation_kind: str = "software"  # "software", or the verified evidence kinds, e.g. "snp+nvidia"
    node_url: str = ""  # where the attestation says the node serves


class DuplicateListingError(Exception):
    """One node was listed more than once (under several node ids, or two listings share an
    attester key, an OHTTP key configuration or a URL): the whole round is refused."""


class NodeRefused(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_REASONS = (
    (UntrustedKeyError, "untrusted_key"),
    (BadSignatureError, "bad_signature"),
    (AttestationExpiredError, "expired"),
    (AttestationNotYetValidError, "expired"),
    (OhttpKeyMismatchError, "key_mismatch"),
    (NonceMismatchError, "stale"),
    (AttesterTypeRefusedError, "attester_type"),
    (UnsupportedEvidenceError, "unsupported_evidence"),
    (BaseMismatchError, "base_mismatch"),
)


_KINDS = Choice.of("snp", "tdx", "nvidia", "none")
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
        self._evidence_policy = config.evidence_policy
        self._release_policy = config.release_policy
        self._leeway_s = config.clock_leeway_s
        self._log = LogClient(
            config.log_url,
            config.log_public_key,
            state_path=client_state_path(config),
            witness=WitnessPolicy(config.witness_keys, config.max_tree_head_age_s),
        )
        self._index = ReleaseIndex(self._log)
        self._releases = releases if releases is not None else self._index
        self.last_refused: dict[str, int] = {}  # reason -> nodes refused for it in the last round

    def logged_issuer_keys(self, issuer: str, refresh: bool = False) -> list[IssuerKeyEntry]:
        """The issuer key entries in the log (the same witnessed, consistency-checked view as releases)."""
        return self._index.issuer_keys(issuer, refresh=refresh)

    def close(self) -> None:
        self._log.close()

    def verify_all(self, offered: list, expected_nonce: bytes) -> list[VerifiedNode]:
        """The offered nodes that pass; `last_refused` counts the others of this round by reason.
        DuplicateListingError when two verified entries are one node (a gateway listing one node
        under many ids would multiply its share of the client's draw)."""
        out: list[VerifiedNode] = []
        refused_by: dict[str, int] = {}
        for entry in offered:
            try:
                out.append(self.verify(entry, expected_nonce=expected_nonce))
            except NodeRefused as refused:
                emit("client.refused_node", reason=refused.reason)
                refused_by[refused.reason] = refused_by.get(refused.reason, 0) + 1
        self.last_refused = refused_by
        if _has_duplicates(out):
            emit("client.refused_node", reason="duplicate_listing")
            self.last_refused = {**refused_by, "duplicate_listing": len(out)}
            raise DuplicateListingError("the gateway listed one node more than once; the round is refused")
        return out

    def verify(self, entry: dict, *, expected_nonce: bytes, now: float | None = None) -> VerifiedNode:
        now = time.time() if now is None else now
        try:
            ohttp_keys = base64.b64decode(entry["ohttp_keys"], validate=True)
            key_config = decode_ohttp_keys(ohttp_keys)[0]  # newest first
            document, base = entry["attestation"], _base(entry)
            evidence = evidence_from_json(entry.get("evidence", []))
            keys, kind = self._trusted_keys(evidence_bound(document, base), evidence)
            claims = verify_with_base(
                document, base, keys, now, expected_nonce, ohttp_keys=ohttp_keys, leeway_s=self._leeway_s
            )
            if self._evidence_policy is None:
                check_attester_type(self._policy, claims.attester_type)
            elif claims.attester_type != _attester_type(kind):
                _evidence_refused("attester_type", "none", "none")
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
        emit("client.attestation_kind", kind=kind)
        return VerifiedNode(
            node_id,
            claims.capacity,
            key_config,
            combined,
            document_kid(entry["attestation"]),
            now,
            kind,
            claims.node_url,
        )

    def _trusted_keys(self, document: str, evidence: tuple[Evidence, ...]) -> tuple[list[Ed25519PublicKey], str]:
        """The keys to authenticate `document` with, and the attestation kind they stand for: under an
        evidence policy, what `check_evidence` vouches for (or the pinned keys, for the software
        attester where the policy allows it); without one, the pinned keys, and no evidence at all."""
        if self._evidence_policy is None:
            if evidence:
                raise NodeRefused("evidence_without_policy")
            return list(self._attester_keys.values()), SOFTWARE
        try:
            verdict = check_evidence(self._evidence_policy, document, evidence, list(self._attester_keys.values()))
        except PolicyRefusedError as exc:
            kind, check, code = _split_reason(exc.reason)
            _evidence_refused(code, kind, check)
        return list(verdict.keys), verdict.kind


def _base(entry: dict) -> str | None:
    """The base document an entry offers (hardware evidence binds it); only beside evidence."""
    base = entry.get("base_attestation")
    if base is not None and (not isinstance(base, str) or not entry.get("evidence")):
        raise ValueError("base_attestation")
    return base


def _has_duplicates(nodes: list[VerifiedNode]) -> bool:
    """Whether two entries share a node id, an attester key, an OHTTP key configuration or a URL."""
    for identity in (
        lambda n: n.node_id,
        lambda n: n.attester_kid,
        lambda n: n.key_config.encode(),
        lambda n: n.node_url,
    ):
        seen = [identity(n) for n in nodes if identity(n) != ""]
        if len(set(seen)) != len(seen):
            return True
    return False


def _attester_type(kind: str) -> str:
    return SOFTWARE if kind == SOFTWARE else HardwareAttester.attester_type


def _split_reason(reason: str) -> tuple[str, str, str]:
    """(kind, check, code) of a PolicyRefusedError reason: "snp:report-data" is a failed check,
    "snp:report-data:not_run" a required check that did not run, "snp:malformed" bytes that do not
    parse, "snp:no_trust_anchor" a kind the policy pins no root for; anything else is a plain code."""
    parts = reason.split(":")
    if len(parts) == 1:
        return "none", "none", reason
    if parts[1] in ("malformed", "no_trust_anchor"):
        return parts[0], "none", "report_malformed" if parts[1] == "malformed" else "no_trust_anchor"
    return parts[0], parts[1], "check_not_run" if parts[-1] == "not_run" else "report_failed"


def _evidence_refused(code: str, kind: str, check: str) -> NoReturn:
    """Record why (fixed codes only: no evidence bytes, no node-chosen text) and refuse the node."""
    fields = {"reason": code, "kind": kind, "check": check}
    if not all(
        value in choice.values for value, choice in ((code, EVIDENCE_REFUSAL), (kind, _KINDS), (check, EVIDENCE_CHECK))
    ):
        fields = {"reason": "other", "kind": "none", "check": "none"}
    emit("client.evidence_refused", **fields)
    raise NodeRefused("evidence_refused")
