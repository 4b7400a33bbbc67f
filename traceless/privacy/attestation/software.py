"""Attestation documents: Entity Attestation Token claims (RFC 9711) in a JWT (RFC 7519) signed
with EdDSA / Ed25519 (RFC 8037), in JWS compact serialization (RFC 7515).

    header  {"alg": "EdDSA", "typ": "eat+jwt", "kid": <RFC 7638 JWK thumbprint of the key>}
    claims  {"eat_nonce": b64url (8..64 bytes), "iat": s, "exp": s,
             "measurements": {"code", "model", "config", "combined"} (hex, see measurement.py),
             "ohttp_keys_sha256": hex, "attester_type": "software" | ...,
             "capacity": int, "node_url": str, "evidence": []}

`ohttp_keys_sha256` is the SHA-256 of the node's whole `application/ohttp-keys` body: every key
it currently accepts (keys rotate with an overlap window, so there may be two), so a client can
check any key it is offered against the document. `capacity` is the routing weight the node
claims (a release in the log lists the capacities it allows) and `node_url` where it serves, so
a registration is bound to one place. `evidence` is reserved for hardware evidence (SEV-SNP or
TDX report plus NVIDIA GPU report, whose REPORT_DATA will be a hash of the OHTTP keys, the
client's nonce and the measurement): today it must be empty, and a verifier refuses a document
that carries evidence it cannot check rather than ignoring it.

`Attester` is the interface a node uses to produce documents. The built-in `SoftwareAttester`
holds an in-memory key; what that does and does not prove is in docs/attestation.md.
`verify_attestation` authenticates a document before it reads any claim, and raises one typed
error per reason a client refuses a node.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from traceless.errors import TracelessError
from traceless.privacy.attestation.measurement import Measurement

JWS_ALG = "EdDSA"
EAT_TYP = "eat+jwt"
NONCE_MIN, NONCE_MAX = 8, 64  # RFC 9711 section 4.1: eat_nonce is 8 to 64 bytes
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_HEX32 = re.compile(r"[0-9a-f]{64}")
MAX_CAPACITY = 1_000_000  # the transparency log's release manifests allow no more
MAX_NODE_URL = 2048


class AttestationError(TracelessError):
    """Base class: a client must not use a node whose attestation raises this."""


class MalformedAttestationError(AttestationError):
    """Not a compact JWS of this profile, or its claims are missing or ill-typed."""


class UntrustedKeyError(AttestationError):
    """The document names (kid) a key that is not among the trusted keys."""


class BadSignatureError(AttestationError):
    """The signature does not verify under the trusted key the document names."""


class AttestationExpiredError(AttestationError):
    """`exp` is at or before the verification time."""


class AttestationNotYetValidError(AttestationError):
    """`iat` is after the verification time."""


class NonceMismatchError(AttestationError):
    """`eat_nonce` is not the nonce the verifier sent."""


class OhttpKeyMismatchError(AttestationError):
    """The attested OHTTP key configuration is not the one the client was given."""


class UnsupportedEvidenceError(AttestationError):
    """The document carries hardware evidence this verifier cannot check yet (never ignored)."""


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: object) -> bytes:
    """Strict unpadded base64url (RFC 7515 section 2): no padding, no stray characters."""
    if not isinstance(text, str) or not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise MalformedAttestationError("field is not unpadded base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise MalformedAttestationError("field is not unpadded base64url") from None
    if b64url_encode(data) != text:  # non-zero trailing bits: a second spelling of the same bytes
        raise MalformedAttestationError("field is not canonical base64url")
    return data


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def jwk_thumbprint(public_key: Ed25519PublicKey) -> str:
    """RFC 7638 thumbprint of the OKP JWK (RFC 8037): required members, sorted, no whitespace."""
    jwk = '{"crv":"Ed25519","kty":"OKP","x":"' + b64url_encode(_raw(public_key)) + '"}'
    return b64url_encode(hashlib.sha256(jwk.encode()).digest())


def _strict_json(data: bytes) -> dict:
    def no_duplicates(pairs: list[tuple[str, object]]) -> dict:
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise MalformedAttestationError("JSON object repeats a member")
        return dict(pairs)

    try:
        obj = json.loads(data, object_pairs_hook=no_duplicates)
    except (ValueError, UnicodeDecodeError):
        raise MalformedAttestationError("part is not JSON") from None
    if not isinstance(obj, dict):
        raise MalformedAttestationError("part is not a JSON object")
    return obj


def _hex32(value: object) -> bytes:
    if not isinstance(value, str) or not _HEX32.fullmatch(value):
        raise MalformedAttestationError("digest claim is not 64 lowercase hex digits")
    return bytes.fromhex(value)


def _int(value: object) -> int:
    if type(value) is not int or value < 0:
        raise MalformedAttestationError("time claim is not a non-negative integer")
    return value


def _capacity(value: object) -> int:
    if type(value) is not int or not 1 <= value <= MAX_CAPACITY:
        raise MalformedAttestationError(f"capacity claim is not an integer in [1, {MAX_CAPACITY}]")
    return value


def _node_url(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_NODE_URL or not value.isascii() or not value.isprintable():
        raise MalformedAttestationError("node_url claim is not a printable ASCII string")
    return value


@dataclass(frozen=True, slots=True)
class NodeStatement:
    """What a node asserts about itself in every document: what it runs, the keys it accepts
    (the `application/ohttp-keys` body), its capacity and where it serves."""

    measurement: Measurement
    ohttp_keys: bytes = field(repr=False)
    capacity: int = 1
    node_url: str = ""


@dataclass(frozen=True, slots=True)
class AttestationClaims:
    eat_nonce: bytes
    iat: int  # seconds since the Unix epoch
    exp: int
    measurement: Measurement
    ohttp_keys_sha256: bytes
    attester_type: str
    capacity: int = 1
    node_url: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "eat_nonce": b64url_encode(self.eat_nonce),
            "iat": self.iat,
            "exp": self.exp,
            "measurements": self.measurement.to_hex(),
            "ohttp_keys_sha256": self.ohttp_keys_sha256.hex(),
            "attester_type": self.attester_type,
            "capacity": self.capacity,
            "node_url": self.node_url,
            "evidence": [],
        }

    @classmethod
    def from_json(cls, obj: dict) -> AttestationClaims:
        try:
            nonce, m, attester = b64url_decode(obj["eat_nonce"]), obj["measurements"], obj["attester_type"]
            iat, exp, ohttp = _int(obj["iat"]), _int(obj["exp"]), _hex32(obj["ohttp_keys_sha256"])
            measurement = Measurement(_hex32(m["code"]), _hex32(m["model"]), _hex32(m["config"]))
            combined = _hex32(m["combined"])
            capacity, node_url, evidence = _capacity(obj["capacity"]), _node_url(obj["node_url"]), obj["evidence"]
        except (KeyError, TypeError):
            raise MalformedAttestationError("a required claim is missing") from None
        if not NONCE_MIN <= len(nonce) <= NONCE_MAX or not isinstance(attester, str) or exp <= iat:
            raise MalformedAttestationError("eat_nonce, attester_type or validity period is invalid")
        if measurement.combined != combined:
            raise MalformedAttestationError("combined measurement does not match its components")
        if evidence != []:
            raise UnsupportedEvidenceError("the document carries hardware evidence this verifier cannot check")
        return cls(nonce, iat, exp, measurement, ohttp, attester, capacity, node_url)


def new_claims(
    statement: NodeStatement, nonce: bytes, now: int, attester_type: str, ttl_s: int = 300
) -> AttestationClaims:
    """Claims for a document valid from `now` for `ttl_s` seconds, bound to the verifier's nonce."""
    if not NONCE_MIN <= len(nonce) <= NONCE_MAX or ttl_s <= 0:
        raise ValueError("eat_nonce must be 8..64 bytes and ttl_s positive")
    if not 1 <= statement.capacity <= MAX_CAPACITY:
        raise ValueError(f"capacity must be in [1, {MAX_CAPACITY}]")
    digest = hashlib.sha256(statement.ohttp_keys).digest()
    return AttestationClaims(
        nonce, now, now + ttl_s, statement.measurement, digest, attester_type, statement.capacity, statement.node_url
    )


class Attester(ABC):
    """Produces signed attestation documents for a node.

    Contract: `attest` signs exactly the given claims (whose `attester_type` must equal the
    class's) with the key whose public half is `public_key`, as a JWS that `verify_attestation`
    accepts for that key. A hardware attester keeps this interface: its key is generated inside
    the TEE, and the hardware report binding that key to the launch measurement travels beside
    the document (see docs/attestation.md).
    """

    attester_type: ClassVar[str]

    @property
    @abstractmethod
    def public_key(self) -> Ed25519PublicKey: ...

    @abstractmethod
    def attest(self, claims: AttestationClaims) -> str: ...


def sign_document(key: Ed25519PrivateKey, claims: AttestationClaims) -> str:
    """The compact JWS of `claims` under `key` (for `Attester` implementations)."""
    header = {"alg": JWS_ALG, "typ": EAT_TYP, "kid": jwk_thumbprint(key.public_key())}
    parts = [b64url_encode(json.dumps(p, separators=(",", ":")).encode()) for p in (header, claims.to_json())]
    signing_input = ".".join(parts).encode("ascii")
    return f"{signing_input.decode()}.{b64url_encode(key.sign(signing_input))}"


class SoftwareAttester(Attester):
    """Signs with an Ed25519 key generated in memory when constructed, or the one given (a key the
    deployment keeps across restarts: node/attester_key.py).

    Honest scope: this proves only that whoever holds this key (the node process, and anyone who
    can read its memory, such as the operator) asserted these claims. Nothing measures the code
    that actually runs; a client trusts it only by pinning the key. See docs/attestation.md.
    """

    attester_type: ClassVar[str] = "software"

    def __init__(self, key: Ed25519PrivateKey | None = None) -> None:
        self._key = key if key is not None else Ed25519PrivateKey.generate()

    def __repr__(self) -> str:
        return f"SoftwareAttester(kid={jwk_thumbprint(self.public_key)!r})"

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self._key.public_key()

    def attest(self, claims: AttestationClaims) -> str:
        if claims.attester_type != self.attester_type:
            raise ValueError("claims name a different attester type")
        return sign_document(self._key, claims)


def trusted_by_kid(keys: Iterable[Ed25519PublicKey | bytes]) -> dict[str, Ed25519PublicKey]:
    out = {}
    for key in keys:
        k = Ed25519PublicKey.from_public_bytes(key) if isinstance(key, bytes) else key
        out[jwk_thumbprint(k)] = k
    return out


def document_kid(document: str) -> str:
    """The `kid` a document's header names (unauthenticated: use after verify_attestation, or to
    pick the key to verify with)."""
    parts = document.split(".") if isinstance(document, str) else []
    kid = _strict_json(b64url_decode(parts[0])).get("kid") if len(parts) == 3 else None
    if not isinstance(kid, str):
        raise MalformedAttestationError("not a JWS compact serialization with a kid")
    return kid


def verify_attestation(
    document: str,
    trusted_keys: Iterable[Ed25519PublicKey | bytes],
    now: float,
    expected_nonce: bytes | None = None,
    *,
    ohttp_keys: bytes | None = None,
    leeway_s: int = 0,
) -> AttestationClaims:
    """Authenticate `document`, then check its validity period (with `leeway_s` of clock skew
    either way), nonce and OHTTP key binding (`ohttp_keys`: the application/ohttp-keys body)."""
    parts = document.split(".") if isinstance(document, str) else []
    if len(parts) != 3:
        raise MalformedAttestationError("not a JWS compact serialization")
    header = _strict_json(b64url_decode(parts[0]))
    payload, signature = b64url_decode(parts[1]), b64url_decode(parts[2])
    kid = header.get("kid")
    if (
        header.get("alg") != JWS_ALG
        or str(header.get("typ", "")).lower() != EAT_TYP
        or "crit" in header
        or not isinstance(kid, str)
    ):
        raise MalformedAttestationError("header is not alg EdDSA, typ eat+jwt, a kid and no crit")
    key = trusted_by_kid(trusted_keys).get(kid)
    if key is None:
        raise UntrustedKeyError("document is signed by a key that is not trusted")
    try:
        key.verify(signature, f"{parts[0]}.{parts[1]}".encode("ascii"))
    except InvalidSignature:
        raise BadSignatureError("document signature does not verify") from None
    # Only now, authenticated, are the claims read.
    claims = AttestationClaims.from_json(_strict_json(payload))
    if claims.iat > now + leeway_s:
        raise AttestationNotYetValidError("document is issued in the future")
    if claims.exp <= now - leeway_s:
        raise AttestationExpiredError("document has expired")
    if expected_nonce is not None and not hmac.compare_digest(claims.eat_nonce, expected_nonce):
        raise NonceMismatchError("document does not carry the verifier's nonce")
    if ohttp_keys is not None and not hmac.compare_digest(
        claims.ohttp_keys_sha256, hashlib.sha256(ohttp_keys).digest()
    ):
        raise OhttpKeyMismatchError("document attests a different OHTTP key configuration")
    return claims
