"""RSABSSA (RFC 9474): Appendix A known answers for all four variants, plus round trips,
input checks and the fault-attack safeguard."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.privacy.token_vectors import rsabssa_vectors
from traceless.privacy.privacypass import blind_rsa
from traceless.privacy.privacypass.blind_rsa import Variant
from traceless.privacy.privacypass.emsa_pss import emsa_pss_encode, mgf1
from traceless.privacy.privacypass.errors import (
    BlindingError,
    InvalidInputError,
    InvalidSignatureError,
    SigningFailureError,
)

VECTORS = rsabssa_vectors()


def _vector_key(v: dict) -> rsa.RSAPrivateKey:
    p, q, d = int(v["p"], 16), int(v["q"], 16), int(v["d"], 16)
    public = rsa.RSAPublicNumbers(int(v["e"], 16), int(v["n"], 16))
    numbers = rsa.RSAPrivateNumbers(
        p, q, d, rsa.rsa_crt_dmp1(d, p), rsa.rsa_crt_dmq1(d, q), rsa.rsa_crt_iqmp(p, q), public
    )
    return numbers.private_key()


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def test_vector_file_covers_all_four_variants():
    assert sorted(v["name"] for v in VECTORS) == sorted(x.rfc_name for x in Variant)


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_rfc9474_vector(v):
    h = lambda name: bytes.fromhex(v[name])  # noqa: E731
    sk = _vector_key(v)
    pk = sk.public_key()
    n = int(v["n"], 16)
    variant = Variant.from_rfc_name(v["name"])
    assert variant.salt_len == len(h("salt"))

    prepared = blind_rsa.prepare(variant, h("msg"), msg_prefix=h("msg_prefix"))
    assert prepared == h("prepared_msg")
    encoded = emsa_pss_encode(prepared, n.bit_length() - 1, salt=h("salt"), hash_name="sha384")
    assert encoded == h("encoded_msg")

    inv = int(v["inv"], 16)  # the file gives r^-1 mod n; blind() takes r
    result = blind_rsa.blind(variant, pk, prepared, salt=h("salt"), r=pow(inv, -1, n))
    assert result.blinded_msg == h("blinded_msg")
    assert result.inv == inv

    blind_sig = blind_rsa.blind_sign(sk, h("blinded_msg"))
    assert blind_sig == h("blind_sig")
    sig = blind_rsa.finalize(variant, pk, prepared, blind_sig, inv)
    assert sig == h("sig")
    blind_rsa.verify(variant, pk, prepared, sig)
    with pytest.raises(InvalidSignatureError):
        blind_rsa.verify(variant, pk, prepared + b"x", sig)


def test_mgf1_length_and_prefix_property():
    long = mgf1(b"seed", 200, "sha384")
    assert len(long) == 200
    assert mgf1(b"seed", 37, "sha384") == long[:37]
    assert mgf1(b"seee", 37, "sha384") != long[:37]


@pytest.mark.parametrize("key_bits", [2048, 2049])
@pytest.mark.parametrize("salt_len", [0, 48])
@settings(max_examples=5, deadline=None)
@given(msg=st.binary(max_size=64), salt_seed=st.binary(min_size=48, max_size=48))
def test_emsa_pss_encoding_is_accepted_by_openssl(keys_by_bits, key_bits, salt_len, msg, salt_seed):
    """Raw-sign our EM with d and check OpenSSL's PSS verifier accepts it (odd bit lengths too)."""
    sk = keys_by_bits[key_bits]
    numbers = sk.private_numbers()
    n = numbers.public_numbers.n
    em = emsa_pss_encode(msg, n.bit_length() - 1, salt=salt_seed[:salt_len], hash_name="sha384")
    sig = pow(int.from_bytes(em, "big"), numbers.d, n).to_bytes((n.bit_length() + 7) // 8, "big")
    pss = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=salt_len)
    sk.public_key().verify(sig, msg, pss, hashes.SHA384())


@pytest.fixture(scope="module")
def keys_by_bits(key) -> dict[int, rsa.RSAPrivateKey]:
    return {2048: key, 2049: rsa.generate_private_key(public_exponent=65537, key_size=2049)}


@pytest.mark.parametrize("variant", list(Variant), ids=lambda x: x.rfc_name)
def test_round_trip_every_variant(key, variant):
    pk = key.public_key()
    prepared = blind_rsa.prepare(variant, b"hello token")
    assert (prepared != b"hello token") == variant.randomized
    result = blind_rsa.blind(variant, pk, prepared)
    blind_sig = blind_rsa.blind_sign(key, result.blinded_msg)
    sig = blind_rsa.finalize(variant, pk, prepared, blind_sig, result.inv)
    blind_rsa.verify(variant, pk, prepared, sig)


def test_only_psszero_deterministic_gives_the_same_signature_twice(key):
    pk = key.public_key()

    def sign_once(variant: Variant) -> bytes:
        prepared = blind_rsa.prepare(variant, b"same message")
        result = blind_rsa.blind(variant, pk, prepared)
        return blind_rsa.finalize(variant, pk, prepared, blind_rsa.blind_sign(key, result.blinded_msg), result.inv)

    assert sign_once(Variant.SHA384_PSSZERO_DETERMINISTIC) == sign_once(Variant.SHA384_PSSZERO_DETERMINISTIC)
    pss = Variant.SHA384_PSS_DETERMINISTIC
    assert sign_once(pss) != sign_once(pss)


def test_blinded_messages_of_one_message_differ(key):
    variant = Variant.SHA384_PSSZERO_DETERMINISTIC  # same EM both times: only r differs
    a = blind_rsa.blind(variant, key.public_key(), b"m")
    b = blind_rsa.blind(variant, key.public_key(), b"m")
    assert a.blinded_msg != b.blinded_msg


def test_faulty_crt_signature_is_withheld(key):
    """A fault in one CRT half (Bellcore attack) must never produce a released signature."""
    good = key.private_numbers()
    faulty = rsa.RSAPrivateNumbers(
        good.p, good.q, good.d, good.dmp1 ^ 2, good.dmq1, good.iqmp, good.public_numbers
    ).private_key(unsafe_skip_rsa_key_validation=True)
    result = blind_rsa.blind(Variant.SHA384_PSS_DETERMINISTIC, key.public_key(), b"m")
    with pytest.raises(SigningFailureError):
        blind_rsa.blind_sign(faulty, result.blinded_msg)
    assert blind_rsa.blind_sign(key, result.blinded_msg)  # the healthy key signs it


def test_blind_sign_input_checks(key):
    n = key.public_key().public_numbers().n
    with pytest.raises(InvalidInputError):
        blind_rsa.blind_sign(key, b"\x01" * 255)
    with pytest.raises(InvalidInputError):
        blind_rsa.blind_sign(key, n.to_bytes(256, "big"))  # m == n is out of range


def _larger_key(pk: rsa.RSAPublicKey) -> rsa.RSAPublicKey:
    """A second key whose modulus exceeds pk's, so pk's blind signature and inverse are in range
    for it and finalize must reject the signature itself (a smaller modulus fails earlier, on input
    range, which is a different error)."""
    while True:
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
        if other.public_numbers().n > pk.public_numbers().n:
            return other


def test_finalize_rejects_wrong_inputs(key):
    variant = Variant.SHA384_PSS_RANDOMIZED
    pk = key.public_key()
    prepared = blind_rsa.prepare(variant, b"msg")
    result = blind_rsa.blind(variant, pk, prepared)
    blind_sig = blind_rsa.blind_sign(key, result.blinded_msg)
    other = _larger_key(pk)
    with pytest.raises(InvalidSignatureError):
        blind_rsa.finalize(variant, pk, prepared + b"!", blind_sig, result.inv)
    with pytest.raises(InvalidSignatureError):
        blind_rsa.finalize(variant, other, prepared, blind_sig, result.inv)
    with pytest.raises(InvalidSignatureError):
        blind_rsa.finalize(Variant.SHA384_PSSZERO_RANDOMIZED, pk, prepared, blind_sig, result.inv)
    with pytest.raises(InvalidInputError):
        blind_rsa.finalize(variant, pk, prepared, blind_sig[1:], result.inv)
    with pytest.raises(InvalidInputError):
        blind_rsa.finalize(variant, pk, prepared, blind_sig, 0)


@settings(max_examples=40, deadline=None)
@given(bit=st.integers(min_value=0, max_value=2047))
def test_any_flipped_bit_in_blind_sig_is_rejected(signed_once, bit):
    variant, pk, prepared, blind_sig, inv = signed_once
    flipped = bytearray(blind_sig)
    flipped[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(InvalidSignatureError):
        blind_rsa.finalize(variant, pk, prepared, bytes(flipped), inv)


@pytest.fixture(scope="module")
def signed_once(key):
    variant = Variant.SHA384_PSS_DETERMINISTIC
    result = blind_rsa.blind(variant, key.public_key(), b"flip me")
    blind_sig = blind_rsa.blind_sign(key, result.blinded_msg)
    blind_rsa.finalize(variant, key.public_key(), b"flip me", blind_sig, result.inv)
    return variant, key.public_key(), b"flip me", blind_sig, result.inv


def test_non_invertible_or_out_of_range_blind_is_rejected(key):
    p = key.private_numbers().p
    n = key.public_key().public_numbers().n
    for bad_r in (p, 0, n):
        with pytest.raises(BlindingError):
            blind_rsa.blind(Variant.SHA384_PSS_DETERMINISTIC, key.public_key(), b"m", r=bad_r)


def test_short_modulus_is_refused():
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with pytest.raises(InvalidInputError):
        blind_rsa.blind(Variant.SHA384_PSS_DETERMINISTIC, small.public_key(), b"m")
    with pytest.raises(InvalidInputError):
        blind_rsa.blind_sign(small, b"\x00" * 128)


def test_injected_values_are_checked_and_inv_is_not_in_repr(key):
    with pytest.raises(ValueError):
        blind_rsa.blind(Variant.SHA384_PSS_DETERMINISTIC, key.public_key(), b"m", salt=b"short")
    with pytest.raises(ValueError):
        blind_rsa.prepare(Variant.SHA384_PSS_DETERMINISTIC, b"m", msg_prefix=b"\x00" * 32)
    with pytest.raises(ValueError):
        blind_rsa.prepare(Variant.SHA384_PSS_RANDOMIZED, b"m", msg_prefix=b"\x00" * 31)
    result = blind_rsa.blind(Variant.SHA384_PSS_DETERMINISTIC, key.public_key(), b"m")
    assert str(result.inv) not in repr(result)
    assert "inv" not in repr(result)
