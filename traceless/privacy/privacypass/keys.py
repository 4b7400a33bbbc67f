"""Issuer public keys for token type 2: the SPKI encoding and token_key_id (RFC 9578 6.5).

The token key is a DER SubjectPublicKeyInfo that names the key with the RSASSA-PSS OID
(RFC 4055, RFC 5756) and pins its parameters, so the encoding itself says how tokens are
verified:

    SubjectPublicKeyInfo ::= SEQUENCE {
      algorithm  SEQUENCE { id-RSASSA-PSS,
                            RSASSA-PSS-params ::= SEQUENCE {
                              [0] hashAlgorithm    { id-sha384 }            -- no NULL
                              [1] maskGenAlgorithm { id-mgf1, { id-sha384 } }
                              [2] saltLength       48 } }                   -- trailer default
      subjectPublicKey  BIT STRING (RSAPublicKey ::= SEQUENCE { n, e }) }

token_key_id = SHA-256(SPKI). The RFC 9578 vectors pin this exact byte string (the hash
AlgorithmIdentifiers carry no NULL parameters), and key ids only match if it is exact, so
decoding re-encodes and compares instead of trusting a generic parser's leniency.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from traceless.privacy.privacypass.errors import DecodeError

TOKEN_KEY_BITS = 2048  # token type 2 is "Blind RSA (2048-bit)": Nk = 256
PSS_SALT_LEN = 48  # must equal the SHA-384 output size (RFC 9578 section 6.5)

_OID_RSASSA_PSS = bytes.fromhex("06092a864886f70d01010a")  # 1.2.840.113549.1.1.10
_OID_MGF1 = bytes.fromhex("06092a864886f70d010108")  # 1.2.840.113549.1.1.8
_OID_SHA384 = bytes.fromhex("0609608648016503040202")  # 2.16.840.1.101.3.4.2.2


def _der(tag: int, content: bytes) -> bytes:
    """One DER TLV with a definite length (short form below 128, long form above)."""
    n = len(content)
    if n < 0x80:
        length = bytes([n])
    else:
        octets = n.to_bytes((n.bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(octets)]) + octets
    return bytes([tag]) + length + content


def _pss_algorithm_identifier() -> bytes:
    sha384 = _der(0x30, _OID_SHA384)
    params = _der(
        0x30,
        _der(0xA0, sha384) + _der(0xA1, _der(0x30, _OID_MGF1 + sha384)) + _der(0xA2, _der(0x02, bytes([PSS_SALT_LEN]))),
    )
    return _der(0x30, _OID_RSASSA_PSS + params)


def encode_token_key(public_key: rsa.RSAPublicKey) -> bytes:
    """DER SPKI of public_key under the RSASSA-PSS OID with SHA-384/MGF1-SHA-384/48."""
    rsa_public_key = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
    bit_string = _der(0x03, b"\x00" + rsa_public_key)  # 0 unused bits
    return _der(0x30, _pss_algorithm_identifier() + bit_string)


def decode_token_key(spki: bytes) -> rsa.RSAPublicKey:
    """Parse a type-2 token key; anything but the exact encoding above is refused."""
    try:
        key = serialization.load_der_public_key(bytes(spki))
    except (ValueError, UnsupportedAlgorithm):
        raise DecodeError("token key is not a DER SubjectPublicKeyInfo") from None
    if not isinstance(key, rsa.RSAPublicKey) or key.key_size != TOKEN_KEY_BITS:
        raise DecodeError(f"token key is not an RSA-{TOKEN_KEY_BITS} key")
    if encode_token_key(key) != spki:
        raise DecodeError("token key is not an RSASSA-PSS SHA-384 SPKI in canonical DER")
    return key


def token_key_id(spki: bytes) -> bytes:
    return hashlib.sha256(spki).digest()


@dataclass(frozen=True, slots=True)
class IssuerPublicKey:
    """An issuer's token key: encoded SPKI, key object and token_key_id, kept consistent."""

    spki: bytes = field(repr=False)
    public_key: rsa.RSAPublicKey = field(repr=False, compare=False)
    token_key_id: bytes

    def __post_init__(self) -> None:
        if encode_token_key(self.public_key) != self.spki:
            raise DecodeError("public_key does not match spki")
        if self.token_key_id != token_key_id(self.spki):
            raise DecodeError("token_key_id is not SHA-256(spki)")

    @classmethod
    def from_spki(cls, spki: bytes) -> IssuerPublicKey:
        spki = bytes(spki)
        return cls(spki, decode_token_key(spki), token_key_id(spki))

    @classmethod
    def from_public_key(cls, public_key: rsa.RSAPublicKey) -> IssuerPublicKey:
        return cls.from_spki(encode_token_key(public_key))

    @property
    def truncated_token_key_id(self) -> int:
        """The least significant byte of token_key_id, as sent in TokenRequest."""
        return self.token_key_id[-1]
