"""Privacy Pass structures: RFC 9577 Appendix A challenge/digest vectors, strict decoding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.privacy.token_vectors import challenge_vectors, type2_issuance_vectors
from traceless.privacy.privacypass.errors import DecodeError, UnsupportedTokenTypeError
from traceless.privacy.privacypass.keys import token_key_id
from traceless.privacy.privacypass.wire import NK, Token, TokenChallenge, TokenRequest, TokenResponse, token_input

CHALLENGE_VECTORS = challenge_vectors()
TYPE2_CHALLENGE_VECTORS = [v for v in CHALLENGE_VECTORS if v["token_type"] == "0002"]


def test_vector_counts():
    assert len(CHALLENGE_VECTORS) == 6
    assert len(TYPE2_CHALLENGE_VECTORS) == 5


@pytest.mark.parametrize("v", TYPE2_CHALLENGE_VECTORS, ids=lambda v: v["label"][:13])
def test_rfc9577_challenge_digest_and_authenticator_input(v):
    challenge = TokenChallenge(
        token_type=int(v["token_type"], 16),
        issuer_name=bytes.fromhex(v["issuer_name"]).decode("ascii"),
        redemption_context=bytes.fromhex(v["redemption_context"]),
        origin_info=bytes.fromhex(v["origin_info"]).decode("ascii"),
    )
    assert TokenChallenge.decode(challenge.encode()) == challenge
    key_id = bytes.fromhex(v["token_key_id"])
    expected = bytes.fromhex(v["token_authenticator_input"])
    assert token_input(bytes.fromhex(v["nonce"]), challenge.digest(), key_id) == expected
    token = Token(2, bytes.fromhex(v["nonce"]), challenge.digest(), key_id, b"\x00" * NK)
    assert token.authenticator_input() == expected


def test_rfc9577_key_id_is_sha256_of_the_rfc9578_spki():
    spki = bytes.fromhex(type2_issuance_vectors()[0]["pkS"])
    assert token_key_id(spki).hex() == TYPE2_CHALLENGE_VECTORS[0]["token_key_id"]


def test_rfc9577_type0_vector_is_refused_as_unsupported():
    (v,) = [v for v in CHALLENGE_VECTORS if v["token_type"] == "0000"]
    raw = bytes.fromhex(v["token_authenticator_input"])
    with pytest.raises(UnsupportedTokenTypeError):
        Token.decode(raw)


def test_origin_names_split():
    challenge = TokenChallenge(2, "issuer.example", b"", "foo.example,bar.example")
    assert challenge.origin_names() == ["foo.example", "bar.example"]
    assert TokenChallenge(2, "issuer.example", b"", "").origin_names() == []


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(issuer_name=""),
        dict(issuer_name="issuer example"),
        dict(issuer_name="issuer.exämple"),
        dict(redemption_context=b"\x00" * 31),
        dict(redemption_context="x" * 32),
        dict(origin_info="a.example, b.example"),
        dict(token_type=0x10000),
    ],
)
def test_challenge_validation(kwargs):
    fields = dict(token_type=2, issuer_name="issuer.example", redemption_context=b"", origin_info="")
    fields.update(kwargs)
    with pytest.raises(DecodeError):
        TokenChallenge(**fields)


names = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)


@given(
    token_type=st.integers(0, 0xFFFF),
    issuer=names.filter(bool),
    context=st.sampled_from([b"", b"\x07" * 32]),
    origins=names,
)
def test_challenge_round_trip(token_type, issuer, context, origins):
    challenge = TokenChallenge(token_type, issuer, context, origins)
    encoded = challenge.encode()
    assert TokenChallenge.decode(encoded) == challenge
    with pytest.raises(DecodeError):
        TokenChallenge.decode(encoded + b"\x00")
    with pytest.raises(DecodeError):
        TokenChallenge.decode(encoded[:-1] if origins else encoded[:-2])


@given(key_id=st.integers(0, 255), blinded=st.binary(min_size=NK, max_size=NK))
def test_token_request_round_trip(key_id, blinded):
    request = TokenRequest(2, key_id, blinded)
    encoded = request.encode()
    assert len(encoded) == 3 + NK
    assert TokenRequest.decode(encoded) == request
    with pytest.raises(DecodeError):
        TokenRequest.decode(encoded[:-1])
    with pytest.raises(DecodeError):
        TokenRequest.decode(encoded + b"\x00")
    with pytest.raises(UnsupportedTokenTypeError):
        TokenRequest.decode(b"\x00\x01" + encoded[2:])


@given(blind_sig=st.binary(min_size=NK, max_size=NK))
def test_token_response_round_trip(blind_sig):
    assert TokenResponse.decode(blind_sig) == TokenResponse(blind_sig)
    with pytest.raises(DecodeError):
        TokenResponse.decode(blind_sig[1:])
    with pytest.raises(DecodeError):
        TokenResponse.decode(blind_sig + b"\x00")


@given(parts=st.tuples(*(st.binary(min_size=n, max_size=n) for n in (32, 32, 32, NK))))
def test_token_round_trip(parts):
    token = Token(2, *parts)
    encoded = token.encode()
    assert len(encoded) == 2 + 32 + 32 + 32 + NK
    assert Token.decode(encoded) == token
    with pytest.raises(DecodeError):
        Token.decode(encoded[:-1])
    with pytest.raises(DecodeError):
        Token.decode(encoded + b"\x00")
    with pytest.raises(UnsupportedTokenTypeError):
        Token.decode(b"\x00\x01" + encoded[2:])


def test_wrong_field_lengths_are_refused():
    with pytest.raises(DecodeError):
        Token(2, b"\x00" * 31, b"\x00" * 32, b"\x00" * 32, b"\x00" * NK)
    with pytest.raises(DecodeError):
        TokenRequest(2, 256, b"\x00" * NK)
    with pytest.raises(DecodeError):
        TokenResponse(b"\x00" * (NK - 1))
