"""PrivateToken HTTP headers (RFC 9577 section 2): the Appendix A.2 WWW-Authenticate
examples, Authorization round trips and the RFC 9110 list syntax."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.privacy.token_vectors import header_vector_blocks, type2_issuance_vectors
from traceless.privacy.privacypass.errors import DecodeError, HeaderParseError, UnsupportedTokenTypeError
from traceless.privacy.privacypass.http import (
    PrivateTokenChallenge,
    b64url_decode,
    b64url_encode,
    choose_challenge,
    format_authorization,
    format_www_authenticate,
    parse_authorization,
    parse_www_authenticate,
)
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.wire import NK, Token, TokenChallenge

BLOCKS = header_vector_blocks()
RFC_KEY = IssuerPublicKey.from_spki(bytes.fromhex(type2_issuance_vectors()[0]["pkS"]))
TOKEN = Token(2, b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, b"\x04" * NK)


def test_three_header_examples():
    assert len(BLOCKS) == 3


@pytest.mark.parametrize("block", BLOCKS, ids=["single", "two", "grease"])
def test_rfc9577_www_authenticate_example(block):
    challenges = parse_www_authenticate(block["WWW-Authenticate"])
    count = sum(1 for name in block if name.startswith("token-challenge-"))
    assert len(challenges) == count
    for i, parsed in enumerate(challenges):
        assert parsed.challenge.hex() == block[f"token-challenge-{i}"]
        assert parsed.token_key.hex() == block[f"token-key-{i}"]
        assert parsed.token_type == int(block[f"token-type-{i}"], 16)
        expected_max_age = block.get(f"max-age-{i}")
        assert parsed.max_age == (int(expected_max_age) if expected_max_age else None)
    assert parse_www_authenticate(format_www_authenticate(challenges)) == challenges


def test_example_type2_challenge_and_key_decode():
    (challenge,) = parse_www_authenticate(BLOCKS[0]["WWW-Authenticate"])
    decoded = TokenChallenge.decode(challenge.challenge)
    assert (decoded.issuer_name, decoded.origin_info) == ("issuer.example", "origin.example")
    assert IssuerPublicKey.from_spki(challenge.token_key) == RFC_KEY


def test_choose_challenge_follows_rfc9577_client_rules():
    two = parse_www_authenticate(BLOCKS[1]["WWW-Authenticate"])
    selected = choose_challenge(two, "ORIGIN.example", RFC_KEY)
    assert selected is not None and selected.challenge.token_type == 2
    assert selected.max_age == 10
    assert choose_challenge(two, "other.example", RFC_KEY) is None
    changed_key = two[0].token_key[:-1] + bytes([two[0].token_key[-1] ^ 1])
    other_key = PrivateTokenChallenge(two[0].challenge, changed_key, 10)
    assert choose_challenge([other_key], "origin.example", RFC_KEY) is None
    grease = parse_www_authenticate(BLOCKS[2]["WWW-Authenticate"])
    assert choose_challenge(grease, "origin.example", RFC_KEY) is None
    no_key = PrivateTokenChallenge(two[0].challenge)
    assert choose_challenge([no_key], "origin.example", RFC_KEY) is not None


def test_authorization_round_trip_and_forms():
    header = format_authorization(TOKEN)
    assert header.startswith('PrivateToken token="') and header.endswith('"')
    assert parse_authorization(header) == TOKEN
    raw = b64url_encode(TOKEN.encode())
    unpadded = raw.rstrip("=")
    assert parse_authorization(f"privatetoken  Token={unpadded}, extra=1") == TOKEN
    assert parse_authorization(f'PrivateToken token = "{raw}"') == TOKEN


@pytest.mark.parametrize(
    "value",
    [
        "",
        'Basic realm="x"',
        "PrivateToken",
        'PrivateToken other="x"',
        'PrivateToken token="AAAA", PrivateToken token="AAAA"',
        'PrivateToken token="not base64!"',
        'PrivateToken token="AAB="',  # non-canonical trailing bits
        'PrivateToken token="AAIB"',  # decodes, but is no Token
        'PrivateToken token="unterminated',
        'PrivateToken token="a" junk',
        'PrivateToken token="a", token="b"',
    ],
)
def test_bad_authorization_is_refused(value):
    with pytest.raises(DecodeError):
        parse_authorization(value)


def test_authorization_with_other_token_type_is_unsupported():
    other = b"\x00\x01" + TOKEN.encode()[2:]
    with pytest.raises(UnsupportedTokenTypeError):
        parse_authorization(f'PrivateToken token="{b64url_encode(other)}"')


def test_unusable_challenges_are_skipped_not_fatal():
    good = PrivateTokenChallenge(b"\x00\x02abc", b"key", 5).to_header_element()
    value = ", ".join(
        [
            "PrivateToken abc==",  # token68 form
            'PrivateToken token-key="AAAA"',  # no challenge
            'PrivateToken challenge="###"',
            'PrivateToken challenge="AAIA", max-age="ten"',
            'Basic realm="r", Bearer',
            good,
        ]
    )
    assert parse_www_authenticate(value) == [PrivateTokenChallenge(b"\x00\x02abc", b"key", 5)]


def test_quoted_pairs_and_whitespace():
    value = 'Other a="x\\"y, z" , PrivateToken challenge = "AAI=" ,max-age=3'
    assert parse_www_authenticate(value) == [PrivateTokenChallenge(b"\x00\x02", None, 3)]


@given(st.text(max_size=80))
def test_arbitrary_header_text_never_crashes(text):
    try:
        parse_www_authenticate(text)
    except HeaderParseError:
        pass
    try:
        parse_authorization(text)
    except DecodeError:
        pass


@given(st.binary(max_size=64))
def test_b64url_round_trip(data):
    text = b64url_encode(data)
    assert b64url_decode(text, "x") == data
    assert b64url_decode(text.rstrip("="), "x") == data


@pytest.mark.parametrize("text", ["a+b/", "AB==", "A", "AA===", "A=A=", "AAAA=="])
def test_b64url_refuses_non_canonical(text):
    with pytest.raises(HeaderParseError):
        b64url_decode(text, "x")
