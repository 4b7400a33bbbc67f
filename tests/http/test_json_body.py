"""Bad JSON is a 400 `invalid_json` at the one boundary every service parses with, never a 500:
nesting past the parser's recursion limit, an integer of 5,000 digits, a lone surrogate (escaped or
as raw bytes), a body that is not UTF-8."""

from __future__ import annotations

import pytest

from tests.support.bad_json import BAD_JSON
from traceless.http.body import decode_json, parse_json
from traceless.http.errors import ApiError


@pytest.mark.parametrize("raw", BAD_JSON.values(), ids=BAD_JSON.keys())
def test_bad_json_is_invalid_json(raw):
    with pytest.raises(ApiError) as err:
        parse_json(raw)
    assert err.value.status == 400 and err.value.code == "invalid_json"
    with pytest.raises(ValueError):
        decode_json(raw.decode("utf-8", "surrogatepass") if raw.startswith(b"{") else raw)


def test_plain_json_still_parses():
    parsed = decode_json(b'{"p": "\\ud83d\\ude00 caf\\u00e9", "n": [1, 2.5, null]}')
    assert parsed == {"p": "😀 café", "n": [1, 2.5, None]}
    assert decode_json(b'"\\\\ud800"') == "\\ud800"  # an escaped backslash, not a surrogate
    assert decode_json(bytearray(b"[" * 500 + b"]" * 500)) is not None
