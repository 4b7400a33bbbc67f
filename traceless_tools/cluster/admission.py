"""Which registrations the gateway admits (threat T14, docs/threat-model.md: capacity is
attested, never announced).

A registration is admitted only when
  1. its attestation verifies under the attester key it presents (proof that the registrant holds
     that key), and that key is trusted: with an evidence policy (evidence_policy.py), because the
     hardware evidence offered with the document verifies, binds the document (or the base
     document offered beside it, whose key must have signed the document and whose claims it must
     restate: privacy/attestation/vouched.py) and vouches for exactly that key (or, only where the
     evidence policy allows the software attester, as below); without one, because the key is
     pinned, or under the explicit development policy any software attester key. The attester
     type must be the one the evidence (or its absence) implies. A gateway without an evidence
     policy refuses evidence it cannot check rather than ignore it;
  2. the document is recent (issued within `max_age_s`, clock leeway either way), binds the OHTTP
     keys registered and the URL registered (so a record is bound to where its node serves);
  3. its measurement is a release in the transparency log, and that release allows the capacity
     the document claims.
The record is keyed by the attester key, so one key holds one record whatever URLs it names, and
only the key's holder can change it (the registry also wants each document no older than the last).
Refusals are ApiErrors naming the rule, never a value the node sent.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from traceless.http.errors import ApiError
from traceless.privacy.attestation.collectors import Evidence
from traceless.privacy.attestation.evidence_policy import AttestationPolicy, PolicyRefusedError, check_evidence
from traceless.privacy.attestation.policy import AttesterPolicy, check_attester_type
from traceless.privacy.attestation.software import AttestationClaims, AttestationError, verify_attestation
from traceless.privacy.attestation.vouched import evidence_bound, verify_with_base
from traceless.privacy.translog.client import LogClientError
from traceless.privacy.translog.release_index import ReleaseLookup, ReleaseNotLoggedError


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """What the gateway demands of a node. `trusted_keys` empty means: under DEVELOPMENT, any
    software attester key (whoever holds it); under PRODUCTION, nothing is trusted yet."""

    attester_policy: AttesterPolicy = AttesterPolicy.PRODUCTION
    trusted_keys: tuple[bytes, ...] = ()
    max_age_s: float = 600.0
    leeway_s: int = 60
    evidence_policy: AttestationPolicy | None = None  # hardware evidence the gateway demands (policy_file.py)


@dataclass(frozen=True, slots=True)
class Admitted:
    """An attestation the gateway accepted: the key that signed it and what it claims."""

    attester_key: bytes
    claims: AttestationClaims


def _refused(code: str, message: str) -> ApiError:
    return ApiError(403, message, type="permission_error", code=code)


def parse_attester_key(value: object) -> bytes:
    """The raw 32-byte Ed25519 key of a registration's `attester_key` (base64)."""
    try:
        raw = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
        Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise ApiError(
            400, "attester_key must be base64 of a raw Ed25519 public key", code="invalid_registration"
        ) from None
    return raw


def verify_document(
    policy: AdmissionPolicy,
    attester_key: bytes,
    document: str,
    ohttp_keys: bytes,
    nonce: bytes | None = None,
    evidence: Sequence[Evidence] = (),
    base: str | None = None,
) -> AttestationClaims:
    """Verify `document` under `attester_key` (signature, validity with leeway, OHTTP keys, nonce) and
    the policy's key, evidence and attester-type rules; ApiError 403 otherwise. With a `base`, the
    evidence binds the base, and the document must be by the same key and restate it (vouched.py)."""
    if base is not None and not evidence:
        raise _refused("attestation_refused", "a base attestation comes only with the evidence that binds it")
    if policy.evidence_policy is not None:
        return _verify_with_evidence(
            policy, policy.evidence_policy, attester_key, document, ohttp_keys, nonce, evidence, base
        )
    if evidence:
        raise _refused(
            "evidence_refused",
            "the node offers hardware evidence but this gateway has no evidence "
            "policy to check it with (start it with --evidence-policy)",
        )
    if policy.trusted_keys and attester_key not in policy.trusted_keys:
        raise _refused("attestation_refused", "the attester key is not trusted by this gateway")
    if not policy.trusted_keys and policy.attester_policy is not AttesterPolicy.DEVELOPMENT:
        raise _refused(
            "attestation_refused",
            "the production attestation policy trusts no attester key yet "
            "(the software attester needs the explicit development policy)",
        )
    try:
        claims = verify_attestation(
            document, [attester_key], time.time(), nonce, ohttp_keys=ohttp_keys, leeway_s=policy.leeway_s
        )
        check_attester_type(policy.attester_policy, claims.attester_type)
    except AttestationError as exc:
        raise _refused("attestation_refused", f"the attestation was refused: {exc}") from None
    return claims


def _verify_with_evidence(
    policy: AdmissionPolicy,
    evidence_policy: AttestationPolicy,
    attester_key: bytes,
    document: str,
    ohttp_keys: bytes,
    nonce: bytes | None,
    evidence: Sequence[Evidence],
    base: str | None,
) -> AttestationClaims:
    """Rule 1 under an evidence policy: the evidence vouches for the key (hardware), or the policy
    allows the software attester and the key is pinned (or, with no pinned keys, proven held)."""
    if not evidence and policy.trusted_keys and attester_key not in policy.trusted_keys:
        raise _refused("attestation_refused", "the attester key is not trusted by this gateway")
    try:
        verdict = check_evidence(
            evidence_policy,
            evidence_bound(document, base),
            evidence,
            (Ed25519PublicKey.from_public_bytes(attester_key),),
        )
    except PolicyRefusedError as exc:
        raise _refused(
            "evidence_refused",
            f"the hardware evidence was refused by the {evidence_policy.name} evidence policy ({exc.reason})",
        ) from None
    if verdict.keys[0].public_bytes_raw() != attester_key:
        raise _refused("evidence_refused", "the evidence vouches for another key than the registered attester key")
    try:
        claims = verify_with_base(
            document, base, verdict.keys, time.time(), nonce, ohttp_keys=ohttp_keys, leeway_s=policy.leeway_s
        )
    except AttestationError as exc:
        raise _refused("attestation_refused", f"the attestation was refused: {exc}") from None
    if claims.attester_type != verdict.attester_type:
        raise _refused("attestation_refused", "the attester type does not match the evidence offered")
    return claims


def admit(policy: AdmissionPolicy, releases: ReleaseLookup, attester_key: bytes, registration) -> Admitted:
    """Admission rules 1-3 for a NodeRegistration (blocking: the release lookup may read the log)."""
    ohttp_keys = base64.b64decode(registration.ohttp_keys)
    claims = verify_document(
        policy,
        attester_key,
        registration.attestation,
        ohttp_keys,
        evidence=registration.evidence,
        base=registration.base_attestation,
    )
    if claims.node_url != registration.url:
        raise _refused("attestation_refused", "the attestation does not bind the registered url")
    if time.time() - claims.iat > policy.max_age_s + policy.leeway_s:
        raise _refused("attestation_refused", "the attestation is too old to register with; send a fresh one")
    try:
        release = releases.release_for(claims.measurement.combined)
    except ReleaseNotLoggedError:
        raise _refused(
            "release_not_logged", "the attested measurement is not a release in the transparency log"
        ) from None
    except LogClientError:
        raise ApiError(
            503,
            "the gateway cannot read the transparency log now; retry later",
            type="server_error",
            code="log_error",
            headers={"Retry-After": "5"},
        ) from None
    if not release.allows_capacity(claims.capacity):
        raise _refused(
            "capacity_not_allowed",
            "the attested capacity is not one of the capacities the logged "
            "release allows (start the node with one of them, or log a release that allows it)",
        )
    return Admitted(attester_key, claims)
