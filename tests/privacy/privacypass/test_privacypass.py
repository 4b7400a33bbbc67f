"""Token type 2 issuance (RFC 9578 section 6): the Appendix A vectors and round trips."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.privacy.token_vectors import type2_issuance_vectors
from traceless.privacy.privacypass import protocol as pp
from traceless.privacy.privacypass.errors import (
    DecodeError,
    InvalidInputError,
    InvalidSignatureError,
    TokenError,
    TokenKeyError,
    TokenRejectedError,
    UnknownTokenKeyError,
    UnsupportedTokenTypeError,
)
from traceless.privacy.privacypass.wire import Token, TokenChallenge, TokenRequest, TokenResponse

VECTORS = type2_issuance_vectors()
CHALLENGE = TokenChallenge(2, "issuer.example", b"\x01" * 32, "origin.example")


@pytest.fixture(scope="module")
def issuers() -> tuple[pp.Issuer, pp.Issuer]:
    """Two fresh issuers whose truncated key ids differ (1 in 256 pairs collide)."""
    first = pp.Issuer.generate()
    second = pp.Issuer.generate()
    while second.public_key.truncated_token_key_id == first.public_key.truncated_token_key_id:
        second = pp.Issuer.generate()
    return first, second


@pytest.fixture(scope="module")
def issued(issuers):
    issuer = issuers[0]
    request, state = pp.begin(CHALLENGE, issuer.public_key)
    response = issuer.issue(request)
    return issuer, request, state, response, pp.finalize(state, response)


def test_five_type2_vectors():
    assert len(VECTORS) == 5


@pytest.mark.parametrize("v", VECTORS, ids=[v["label"] for v in VECTORS])
def test_rfc9578_type2_vector(v):
    h = lambda name: bytes.fromhex(v[name])  # noqa: E731
    issuer = pp.Issuer(serialization.load_pem_private_key(h("skS"), None))
    assert issuer.public_key.spki == h("pkS")
    challenge = TokenChallenge.decode(h("token_challenge"))
    assert challenge.encode() == h("token_challenge")

    request, state = pp.begin(challenge, issuer.public_key, nonce=h("nonce"), salt=h("salt"), r=int(v["blind"], 16))
    assert request.encode() == h("token_request")
    response = issuer.issue(TokenRequest.decode(h("token_request")))
    assert response.encode() == h("token_response")
    token = pp.finalize(state, TokenResponse.decode(h("token_response")))
    assert token.encode() == h("token")
    decoded = Token.decode(h("token"))
    assert decoded.challenge_digest == challenge.digest()
    pp.verify_token(decoded, issuer.public_key)


def test_round_trip_with_fresh_keys(issued):
    issuer, _, _, _, token = issued
    assert token.challenge_digest == CHALLENGE.digest()
    assert token.token_key_id == issuer.public_key.token_key_id
    pp.verify_token(Token.decode(token.encode()), issuer.public_key)


def test_tokens_from_one_challenge_are_distinct(issuers):
    issuer = issuers[0]
    tokens = []
    for _ in range(3):
        request, state = pp.begin(CHALLENGE, issuer.public_key)
        tokens.append(pp.finalize(state, issuer.issue(request)))
    assert len({t.nonce for t in tokens}) == 3


def test_wrong_issuer_key_is_rejected(issuers, issued):
    _, other = issuers
    token = issued[4]
    with pytest.raises(TokenKeyError):
        pp.verify_token(token, other.public_key)
    relabelled = Token(2, token.nonce, token.challenge_digest, other.public_key.token_key_id, token.authenticator)
    with pytest.raises(TokenRejectedError):
        pp.verify_token(relabelled, other.public_key)


def test_issuer_refuses_requests_for_another_key(issuers):
    first, second = issuers
    request, _ = pp.begin(CHALLENGE, second.public_key)
    with pytest.raises(UnknownTokenKeyError):
        first.issue(request)


def test_response_from_another_issuer_fails_finalize(issuers):
    first, second = issuers
    request, state = pp.begin(CHALLENGE, first.public_key)
    forged = TokenRequest(2, second.public_key.truncated_token_key_id, request.blinded_msg)
    if int.from_bytes(request.blinded_msg, "big") >= second.public_key.public_key.public_numbers().n:
        with pytest.raises(InvalidInputError):  # not even a valid input for that key
            second.issue(forged)
        return
    with pytest.raises(InvalidSignatureError):
        pp.finalize(state, second.issue(forged))


@settings(max_examples=60, deadline=None)
@given(bit=st.integers(min_value=0, max_value=(3 + 256) * 8 - 1))
def test_any_flipped_bit_in_a_token_request_yields_no_token(issued, bit):
    issuer, request, state, _, _ = issued
    flipped = _flip(request.encode(), bit)
    try:
        response = issuer.issue(TokenRequest.decode(flipped))
    except (UnsupportedTokenTypeError, UnknownTokenKeyError, InvalidInputError):
        return  # refused by the issuer
    with pytest.raises(InvalidSignatureError):
        pp.finalize(state, response)


@settings(max_examples=60, deadline=None)
@given(bit=st.integers(min_value=0, max_value=256 * 8 - 1))
def test_any_flipped_bit_in_a_token_response_is_rejected(issued, bit):
    _, _, state, response, _ = issued
    with pytest.raises(InvalidSignatureError):
        pp.finalize(state, TokenResponse.decode(_flip(response.encode(), bit)))


@settings(max_examples=60, deadline=None)
@given(bit=st.integers(min_value=0, max_value=(2 + 32 * 3 + 256) * 8 - 1))
def test_any_flipped_bit_in_a_token_fails_signature_verification(issued, bit):
    issuer, _, _, _, token = issued
    with pytest.raises(TokenError):
        pp.verify_token(Token.decode(_flip(token.encode(), bit)), issuer.public_key)


def test_begin_refuses_other_token_types(issuers):
    with pytest.raises(UnsupportedTokenTypeError):
        pp.begin(TokenChallenge(1, "issuer.example", b"", ""), issuers[0].public_key)
    with pytest.raises(ValueError):
        pp.begin(CHALLENGE, issuers[0].public_key, nonce=b"\x00" * 31)


def test_issuer_needs_a_2048_bit_key():
    with pytest.raises(ValueError):
        pp.Issuer(rsa.generate_private_key(public_exponent=65537, key_size=3072))


def test_reprs_hold_no_secrets(issued):
    issuer, _, state, _, _ = issued
    assert repr(state) == "ClientState()"
    assert "BEGIN" not in repr(issuer) and str(issuer.public_key.token_key_id.hex()) in repr(issuer)


def test_decode_errors_are_token_errors():
    with pytest.raises(DecodeError):
        TokenResponse.decode(b"")


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)
