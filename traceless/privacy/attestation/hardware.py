"""A hardware-backed node's attestation: a JWS signed by a key born in the TEE, plus hardware
evidence (a CPU TEE report, GPU reports) that binds that exact document.

    attester = HardwareAttester(cpu=TsmCollector(), gpus=(NvmlCollector(),))
    document = attester.attest(claims)                 # JWS; its header carries the public key
    evidence = attester.evidence(document)             # reports whose REPORT_DATA / nonce bind it

The client cannot pin a key that is generated at boot inside the TEE, so the header carries it
(`jwk`, RFC 7515 section 4.1.3) and the evidence vouches for it: the CPU report's REPORT_DATA is
a hash of the document's signing input (header and claims, see binding.py), and the vendor's key
signed that report. `document_key` reads the key back for the client, which then authenticates
the document with it (`verify_attestation`) only after the evidence has verified.

Evidence travels beside the document as JSON (`evidence_to_json` / `evidence_from_json`), each
item a kind, the raw blob and its auxiliary data (base64), and where it came from.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any, ClassVar

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from traceless.privacy.attestation.binding import (
    GPU_NONCE_SIZE,
    REPORT_DATA_SIZE,
    gpu_nonce,
    report_data,
    signing_input,
)
from traceless.privacy.attestation.collectors import Collector, Evidence
from traceless.privacy.attestation.software import (
    EAT_TYP,
    JWS_ALG,
    AttestationClaims,
    Attester,
    MalformedAttestationError,
    b64url_decode,
    b64url_encode,
    jwk_thumbprint,
)

EVIDENCE_KINDS = ("snp", "tdx", "nvidia")
CPU_KINDS = ("snp", "tdx")
MAX_GPUS = 8  # GPUs per node a document may carry evidence for (an HGX board holds 8)
MAX_EVIDENCE_ITEMS = 1 + MAX_GPUS  # one CPU TEE report and one report per GPU
MAX_EVIDENCE_FIELD = 64 * 1024  # bytes, decoded: reports, quotes and certificate chains are a few KiB
_PROVIDER_MAX = 64


class HardwareAttester(Attester):
    """Signs with an Ed25519 key generated in memory when constructed, inside the TEE the node runs
    in, and collects evidence for each document from the machine's CPU and GPU collectors."""

    attester_type: ClassVar[str] = "hardware"

    def __init__(self, cpu: Collector | None, gpus: Sequence[Collector] = ()) -> None:
        if cpu is None and not gpus:
            raise ValueError("a hardware attester needs at least one evidence collector")
        if len(gpus) > MAX_GPUS:
            raise ValueError(f"a hardware attester collects evidence for at most {MAX_GPUS} GPUs")
        self._key = Ed25519PrivateKey.generate()
        self._cpu = cpu
        self._gpus = tuple(gpus)

    def __repr__(self) -> str:
        return f"HardwareAttester(kid={jwk_thumbprint(self.public_key)!r})"

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self._key.public_key()

    def attest(self, claims: AttestationClaims) -> str:
        if claims.attester_type != self.attester_type:
            raise ValueError("claims name a different attester type")
        return sign_with_key_header(self._key, claims)

    def probe(self) -> None:
        """Collect once, for zero binding values, and discard the result: raises the collector's
        `CollectorUnavailableError` on a machine without the device, so a node fails at start,
        before it loads a model, instead of at its first attestation."""
        if self._cpu is not None:
            self._cpu.collect(bytes(REPORT_DATA_SIZE))
        for gpu in self._gpus:
            gpu.collect(bytes(GPU_NONCE_SIZE))

    def evidence(self, document: str) -> tuple[Evidence, ...]:
        """Fresh evidence binding `document` (raises `CollectorError` when the hardware cannot
        produce it: the node must then not offer the document at all)."""
        si = signing_input(document)
        items = [] if self._cpu is None else [self._cpu.collect(report_data(si))]
        items.extend(gpu.collect(gpu_nonce(si)) for gpu in self._gpus)
        return tuple(items)


def _jwk(public_key: Ed25519PublicKey) -> dict[str, str]:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"crv": "Ed25519", "kty": "OKP", "x": b64url_encode(raw)}


def sign_with_key_header(key: Ed25519PrivateKey, claims: AttestationClaims) -> str:
    """The compact JWS of `claims` whose header names (kid) and carries (jwk) the signing key."""
    header = {"alg": JWS_ALG, "typ": EAT_TYP, "kid": jwk_thumbprint(key.public_key()), "jwk": _jwk(key.public_key())}
    parts = [b64url_encode(json.dumps(p, separators=(",", ":")).encode()) for p in (header, claims.to_json())]
    signing = ".".join(parts).encode("ascii")
    return f"{signing.decode()}.{b64url_encode(key.sign(signing))}"


def document_key(document: str) -> Ed25519PublicKey:
    """The public key a document's header carries (and names by its RFC 7638 thumbprint). It proves
    nothing by itself: it is trusted only once hardware evidence binding the document verifies."""
    try:
        header = json.loads(b64url_decode(signing_input(document).split(b".")[0].decode("ascii")))
        jwk = header["jwk"]
        if set(jwk) != {"crv", "kty", "x"} or jwk["kty"] != "OKP" or jwk["crv"] != "Ed25519":
            raise MalformedAttestationError("header jwk is not an Ed25519 OKP key")
        key = Ed25519PublicKey.from_public_bytes(b64url_decode(jwk["x"]))
    except (ValueError, KeyError, TypeError):
        raise MalformedAttestationError("header carries no usable jwk") from None
    if header.get("kid") != jwk_thumbprint(key):
        raise MalformedAttestationError("header kid is not the thumbprint of its jwk")
    return key


def evidence_to_json(item: Evidence) -> dict[str, str]:
    return {
        "kind": item.kind,
        "blob": base64.b64encode(item.blob).decode("ascii"),
        "aux": base64.b64encode(item.aux).decode("ascii"),
        "provider": item.provider,
    }


def _field(obj: dict[str, Any], name: str) -> bytes:
    value = obj.get(name, "")
    if not isinstance(value, str) or len(value) > MAX_EVIDENCE_FIELD * 4 // 3 + 4:
        raise MalformedAttestationError("evidence field is not base64 of a bounded size")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedAttestationError("evidence field is not base64") from None


def evidence_from_json(items: object) -> tuple[Evidence, ...]:
    """Strictly decode the evidence list a node offers (kinds known, sizes bounded, no extras)."""
    if not isinstance(items, list) or len(items) > MAX_EVIDENCE_ITEMS:
        raise MalformedAttestationError(f"evidence is not a list of at most {MAX_EVIDENCE_ITEMS} items")
    out = []
    for obj in items:
        if not isinstance(obj, dict) or not set(obj) <= {"kind", "blob", "aux", "provider"}:
            raise MalformedAttestationError("evidence item is not an object of kind, blob, aux, provider")
        kind, provider = obj.get("kind"), obj.get("provider", "")
        if kind not in EVIDENCE_KINDS or not isinstance(provider, str) or len(provider) > _PROVIDER_MAX:
            raise MalformedAttestationError("evidence item has an unknown kind or a bad provider")
        blob, aux = _field(obj, "blob"), _field(obj, "aux")
        if not blob:
            raise MalformedAttestationError("evidence item has no blob")
        out.append(Evidence(kind=kind, blob=blob, aux=aux, provider=provider))
    return tuple(out)
