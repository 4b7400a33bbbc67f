"""Type-2 token keys: the RSASSA-PSS SPKI encoding pinned by the RFC 9578 vectors."""

from __future__ import annotations

import hashlib

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.privacy.token_vectors import type2_issuance_vectors
from traceless.privacy.privacypass.errors import DecodeError
from traceless.privacy.privacypass.keys import IssuerPublicKey, decode_token_key, encode_token_key

VECTOR = type2_issuance_vectors()[0]
SPKI = bytes.fromhex(VECTOR["pkS"])


def test_encoding_of_the_rfc_key_matches_pks_exactly():
    private_key = serialization.load_pem_private_key(bytes.fromhex(VECTOR["skS"]), None)
    assert encode_token_key(private_key.public_key()) == SPKI


def test_issuer_public_key_from_spki():
    key = IssuerPublicKey.from_spki(SPKI)
    assert key.token_key_id == hashlib.sha256(SPKI).digest()
    assert key.truncated_token_key_id == key.token_key_id[-1]
    assert key.truncated_token_key_id == bytes.fromhex(VECTOR["token_request"])[2]
    assert "30820152" not in repr(key)


def test_rsa_encryption_oid_is_refused():
    plain = decode_token_key(SPKI).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(DecodeError):
        decode_token_key(plain)


def test_other_pss_parameters_are_refused():
    salt_field = bytes.fromhex("a203020130")  # saltLength [2] INTEGER 48
    assert SPKI.count(salt_field) == 1
    with pytest.raises(DecodeError):
        decode_token_key(SPKI.replace(salt_field, bytes.fromhex("a203020120")))


@pytest.mark.parametrize("bad", [b"", b"\x30\x00", SPKI[:-1], SPKI + b"\x00", b"\x00" * 342])
def test_malformed_spki_is_refused(bad):
    with pytest.raises(DecodeError):
        decode_token_key(bad)


def test_wrong_key_size_is_refused():
    big = rsa.generate_private_key(public_exponent=65537, key_size=3072).public_key()
    with pytest.raises(DecodeError):
        IssuerPublicKey.from_public_key(big)


def test_inconsistent_fields_are_refused():
    key = IssuerPublicKey.from_spki(SPKI)
    with pytest.raises(DecodeError):
        IssuerPublicKey(key.spki, key.public_key, b"\x00" * 32)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    with pytest.raises(DecodeError):
        IssuerPublicKey(key.spki, other, key.token_key_id)
