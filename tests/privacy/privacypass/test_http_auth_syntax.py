"""RFC 9110 section 11 authentication header grammar."""

from __future__ import annotations

import pytest

from traceless.privacy.privacypass.auth_syntax import parse_auth_list
from traceless.privacy.privacypass.errors import HeaderParseError


def test_challenges_params_and_token68():
    value = 'Basic realm="a, b", Newauth abc==, PrivateToken challenge=x ,Token-Key = "y",, Bare'
    assert parse_auth_list(value) == [
        ("Basic", {"realm": "a, b"}, None),
        ("Newauth", {}, "abc=="),
        ("PrivateToken", {"challenge": "x", "token-key": "y"}, None),
        ("Bare", {}, None),
    ]


def test_quoted_pair_unescapes():
    assert parse_auth_list(r'X a="q\"uo\\te"') == [("X", {"a": 'q"uo\\te'}, None)]


def test_trailing_equals_make_a_token68():
    assert parse_auth_list("X a=") == [("X", {}, "a=")]


def test_empty_header_is_an_empty_list():
    assert parse_auth_list("") == []
    assert parse_auth_list(" , ,") == []


@pytest.mark.parametrize(
    "value",
    ['X a="open', "X a=b c", 'X a="1", A="2"', "X a =", "=x", 'X a="\x01"', "X a=b;c"],
)
def test_malformed(value):
    with pytest.raises(HeaderParseError):
        parse_auth_list(value)
