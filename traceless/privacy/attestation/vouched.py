"""A fresh document under a base document: hardware evidence collected once per key set, and a
signature of the key it vouches for on every verifier's nonce.

    base      a document the node signed when it collected its evidence (its own random nonce);
              the evidence's REPORT_DATA / GPU nonce bind the base's signing input (binding.py),
              so the evidence vouches for the key in the base's header
    document  a document the same key signs now, for the verifier's nonce

Hardware evidence is slow to collect (a CPU report through configfs, an SPDM report from each GPU),
so a node collects it once per OHTTP key set, over its base document, and answers each nonce with
a fresh document signed by the key the evidence vouches for. The key is born in the TEE and never
leaves it, so a signature by it over the verifier's nonce shows that TEE is answering now. The
verifier checks the evidence against the base (`check_evidence(policy, base, evidence)`), then
`verify_with_base`: both documents valid now under that key, the fresh one carrying the nonce, and
the fresh one restating exactly what the base attests (key, measurement, OHTTP keys, capacity,
URL, attester type), so nothing the evidence did not vouch for can ride on the fresh signature.

With no base (`None`), the evidence, if any, binds the document itself, as a node that collects
evidence for every document offers it.
"""

from __future__ import annotations

from collections.abc import Iterable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from traceless.privacy.attestation.software import (
    AttestationClaims,
    AttestationError,
    document_kid,
    verify_attestation,
)


class BaseMismatchError(AttestationError):
    """The fresh document is not by the base document's key or does not restate its claims."""


def _statement(claims: AttestationClaims) -> tuple:
    """What a fresh document must restate from its base: everything but nonce and validity."""
    return (claims.measurement, claims.ohttp_keys_sha256, claims.attester_type, claims.capacity, claims.node_url)


def evidence_bound(document: str, base: str | None) -> str:
    """The document the evidence offered beside `document` binds: its base, if it has one."""
    return document if base is None else base


def verify_with_base(
    document: str,
    base: str | None,
    trusted_keys: Iterable[Ed25519PublicKey | bytes],
    now: float,
    expected_nonce: bytes | None,
    *,
    ohttp_keys: bytes | None,
    leeway_s: int = 0,
) -> AttestationClaims:
    """`verify_attestation` of `document`, and with a base, of the base too (without a nonce: the node
    chose it), under the same key, restating the same claims; BaseMismatchError otherwise. Returns
    the fresh document's claims."""
    keys = list(trusted_keys)
    claims = verify_attestation(document, keys, now, expected_nonce, ohttp_keys=ohttp_keys, leeway_s=leeway_s)
    if base is None:
        return claims
    base_claims = verify_attestation(base, keys, now, None, ohttp_keys=ohttp_keys, leeway_s=leeway_s)
    if document_kid(base) != document_kid(document):
        raise BaseMismatchError("the fresh document is signed by another key than its base document")
    if _statement(base_claims) != _statement(claims):
        raise BaseMismatchError("the fresh document does not restate what its base document attests")
    return claims
