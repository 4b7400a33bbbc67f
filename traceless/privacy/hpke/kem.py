"""DHKEM, HPKE's Diffie-Hellman KEM (RFC 9180 §4.1, §7.1): X25519, X448, P-256, P-384, P-521.

The DH functions are `cryptography`'s; this module composes them as the RFC's DHKEM:

    Encap(pkR):  skE, pkE = GenerateKeyPair(); dh = DH(skE, pkR); enc = SerializePublicKey(pkE)
                 shared_secret = ExtractAndExpand(dh, enc || SerializePublicKey(pkR))
    Decap(enc, skR): the same with DH(skR, DeserializePublicKey(enc)).

Private keys live in `KemPrivateKey`, which has no way to serialize its secret: a key that is
generated in memory stays there (threat T10, docs/threat-model.md: a restart is a cryptographic erase).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NoReturn

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, x448, x25519

from traceless.privacy.errors import DecryptError, MalformedMessageError, UnsupportedAlgorithmError
from traceless.privacy.hpke.kdf import Kdf, KdfId


class KemId(enum.IntEnum):
    """HPKE KEM identifiers (RFC 9180 §7.1)."""

    DHKEM_P256_HKDF_SHA256 = 0x0010
    DHKEM_P384_HKDF_SHA384 = 0x0011
    DHKEM_P521_HKDF_SHA512 = 0x0012
    DHKEM_X25519_HKDF_SHA256 = 0x0020
    DHKEM_X448_HKDF_SHA512 = 0x0021


def _hex(groups: str) -> int:
    return int(groups.replace(" ", ""), 16)


@dataclass(frozen=True, slots=True)
class KemParams:
    """Sizes in bytes (Nsecret, Nenc = Npk, Nsk) and DeriveKeyPair inputs for one DHKEM."""

    kdf_id: KdfId
    n_secret: int
    n_enc: int
    n_sk: int
    curve: type[ec.EllipticCurve] | None  # None for X25519 / X448
    order: int = 0  # group order for the NIST curves' rejection sampling (RFC 9180 §7.1.3)
    bitmask: int = 0xFF

    @property
    def n_pk(self) -> int:
        return self.n_enc


_P256_ORDER = _hex("FFFFFFFF 00000000 FFFFFFFF FFFFFFFF BCE6FAAD A7179E84 F3B9CAC2 FC632551")
_P384_ORDER = _hex(
    "FFFFFFFF FFFFFFFF FFFFFFFF FFFFFFFF FFFFFFFF FFFFFFFF C7634D81 F4372DDF 581A0DB2 48B0A77A ECEC196A CCC52973"
)
_P521_ORDER = _hex(
    "01FF FFFFFFFF FFFFFFFF FFFFFFFF FFFFFFFF FFFFFFFF FFFFFFFF FFFFFFFF FFFFFFFA"
    " 51868783 BF2F966B 7FCC0148 F709A5D0 3BB5C9B8 899C47AE BB6FB71E 91386409"
)

_SHA256, _SHA384, _SHA512 = KdfId.HKDF_SHA256, KdfId.HKDF_SHA384, KdfId.HKDF_SHA512
KEM_PARAMS: dict[KemId, KemParams] = {
    KemId.DHKEM_P256_HKDF_SHA256: KemParams(_SHA256, 32, 65, 32, ec.SECP256R1, _P256_ORDER),
    KemId.DHKEM_P384_HKDF_SHA384: KemParams(_SHA384, 48, 97, 48, ec.SECP384R1, _P384_ORDER),
    KemId.DHKEM_P521_HKDF_SHA512: KemParams(_SHA512, 64, 133, 66, ec.SECP521R1, _P521_ORDER, 0x01),
    KemId.DHKEM_X25519_HKDF_SHA256: KemParams(_SHA256, 32, 32, 32, None),
    KemId.DHKEM_X448_HKDF_SHA512: KemParams(_SHA512, 64, 56, 56, None),
}

_PrivateKey = x25519.X25519PrivateKey | x448.X448PrivateKey | ec.EllipticCurvePrivateKey
_PublicKey = x25519.X25519PublicKey | x448.X448PublicKey | ec.EllipticCurvePublicKey


def kem_id_from_int(value: int) -> KemId:
    try:
        return KemId(value)
    except ValueError:
        raise UnsupportedAlgorithmError(f"unsupported HPKE KEM id 0x{value:04x}") from None


def _kem_kdf(kem_id: KemId) -> Kdf:
    # DHKEM's own suite_id is "KEM" || I2OSP(kem_id, 2) (RFC 9180 §4.1).
    return Kdf(KEM_PARAMS[kem_id].kdf_id, b"KEM" + kem_id.to_bytes(2, "big"))


class KemPrivateKey:
    """A DHKEM private key with its serialized public key. Its secret cannot be read back out."""

    __slots__ = ("kem_id", "public_key_bytes", "_key")

    def __init__(self, kem_id: KemId, key: _PrivateKey) -> None:
        self.kem_id = kem_id
        self._key = key
        self.public_key_bytes = _serialize_public_key(key.public_key())

    def __repr__(self) -> str:
        return f"KemPrivateKey({self.kem_id.name}, <redacted>)"

    def __reduce__(self) -> NoReturn:
        raise TypeError("KemPrivateKey is memory-only and cannot be pickled or copied")

    def _dh(self, public_key: _PublicKey) -> bytes:
        key = self._key
        if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(public_key, ec.EllipticCurvePublicKey):
            return key.exchange(ec.ECDH(), public_key)
        if isinstance(key, x25519.X25519PrivateKey) and isinstance(public_key, x25519.X25519PublicKey):
            return key.exchange(public_key)
        if isinstance(key, x448.X448PrivateKey) and isinstance(public_key, x448.X448PublicKey):
            return key.exchange(public_key)
        raise TypeError(f"a {type(public_key).__name__} does not belong to {self.kem_id.name}")


def _serialize_public_key(key: _PublicKey) -> bytes:
    if isinstance(key, ec.EllipticCurvePublicKey):
        uncompressed = serialization.PublicFormat.UncompressedPoint
        return key.public_bytes(serialization.Encoding.X962, uncompressed)
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def deserialize_public_key(kem_id: KemId, pk: bytes) -> _PublicKey:
    """DeserializePublicKey; raises ValueError for a wrong length or a point not on the curve."""
    params = KEM_PARAMS[kem_id]
    if len(pk) != params.n_pk:
        raise ValueError(f"public key must be {params.n_pk} bytes, got {len(pk)}")
    if params.curve is not None:
        return ec.EllipticCurvePublicKey.from_encoded_point(params.curve(), pk)
    if kem_id is KemId.DHKEM_X25519_HKDF_SHA256:
        return x25519.X25519PublicKey.from_public_bytes(pk)
    return x448.X448PublicKey.from_public_bytes(pk)


def generate_key_pair(kem_id: KemId) -> KemPrivateKey:
    params = KEM_PARAMS[kem_id]
    if params.curve is not None:
        return KemPrivateKey(kem_id, ec.generate_private_key(params.curve()))
    if kem_id is KemId.DHKEM_X25519_HKDF_SHA256:
        return KemPrivateKey(kem_id, x25519.X25519PrivateKey.generate())
    return KemPrivateKey(kem_id, x448.X448PrivateKey.generate())


def deserialize_private_key(kem_id: KemId, sk: bytes) -> KemPrivateKey:
    """DeserializePrivateKey (RFC 9180 §7.1.2). For known-answer tests and DeriveKeyPair."""
    params = KEM_PARAMS[kem_id]
    if len(sk) != params.n_sk:
        raise ValueError(f"private key must be {params.n_sk} bytes, got {len(sk)}")
    if params.curve is not None:
        scalar = int.from_bytes(sk, "big")
        if not 0 < scalar < params.order:
            raise ValueError("private scalar out of range")
        return KemPrivateKey(kem_id, ec.derive_private_key(scalar, params.curve()))
    if kem_id is KemId.DHKEM_X25519_HKDF_SHA256:
        return KemPrivateKey(kem_id, x25519.X25519PrivateKey.from_private_bytes(sk))
    return KemPrivateKey(kem_id, x448.X448PrivateKey.from_private_bytes(sk))


def derive_key_pair(kem_id: KemId, ikm: bytes) -> KemPrivateKey:
    """DeriveKeyPair (RFC 9180 §7.1.3): deterministic keys from input keying material."""
    params = KEM_PARAMS[kem_id]
    kdf = _kem_kdf(kem_id)
    dkp_prk = kdf.labeled_extract(b"", b"dkp_prk", ikm)
    if params.curve is None:
        return deserialize_private_key(kem_id, kdf.labeled_expand(dkp_prk, b"sk", b"", params.n_sk))
    # NIST curves: rejection sampling; the bitmask trims P-521's 66 bytes to 521 bits.
    for counter in range(256):
        candidate = bytearray(kdf.labeled_expand(dkp_prk, b"candidate", bytes([counter]), params.n_sk))
        candidate[0] &= params.bitmask
        scalar = int.from_bytes(candidate, "big")
        if 0 < scalar < params.order:
            return deserialize_private_key(kem_id, bytes(candidate))
    raise ValueError("DeriveKeyPairError: no valid scalar in 256 candidates")


def _extract_and_expand(kem_id: KemId, dh: bytes, kem_context: bytes) -> bytes:
    kdf = _kem_kdf(kem_id)
    eae_prk = kdf.labeled_extract(b"", b"eae_prk", dh)
    return kdf.labeled_expand(eae_prk, b"shared_secret", kem_context, KEM_PARAMS[kem_id].n_secret)


def encap(kem_id: KemId, pk_r: bytes, ephemeral: KemPrivateKey | None = None) -> tuple[bytes, bytes]:
    """Encap(pkR) -> (shared_secret, enc). `ephemeral` replaces the fresh key in KATs only."""
    try:
        public_key = deserialize_public_key(kem_id, pk_r)
    except ValueError:
        raise MalformedMessageError(f"invalid {kem_id.name} public key") from None
    sk_e = generate_key_pair(kem_id) if ephemeral is None else ephemeral
    if sk_e.kem_id is not kem_id:
        raise UnsupportedAlgorithmError("ephemeral key belongs to another KEM")
    try:
        dh = sk_e._dh(public_key)
    except ValueError:  # X25519/X448 low-order point: all-zero shared secret
        raise MalformedMessageError(f"invalid {kem_id.name} public key") from None
    enc = sk_e.public_key_bytes
    return _extract_and_expand(kem_id, dh, enc + pk_r), enc


def decap(enc: bytes, sk_r: KemPrivateKey) -> bytes:
    """Decap(enc, skR) -> shared_secret. Any invalid `enc` is the opaque DecryptError."""
    try:
        public_key = deserialize_public_key(sk_r.kem_id, enc)
        dh = sk_r._dh(public_key)
    except ValueError:
        raise DecryptError() from None
    return _extract_and_expand(sk_r.kem_id, dh, enc + sk_r.public_key_bytes)
