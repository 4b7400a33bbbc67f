"""HTTP authentication header syntax (RFC 9110 section 11), enough to read challenges
and credentials:

    WWW-Authenticate = #challenge        Authorization = credentials
    challenge  = auth-scheme [ 1*SP ( token68 / #auth-param ) ]
    auth-param = token BWS "=" BWS ( token / quoted-string )

The list is comma-separated and so are the auth-params inside one challenge, so after each
comma the parser looks ahead: `name =` continues the current challenge, anything else
starts a new one. Parameter names are returned lower-cased (they are case-insensitive);
a repeated name in one challenge is an error (RFC 9110 section 11.2).
"""

from __future__ import annotations

import string
from collections.abc import Collection

from traceless.privacy.privacypass.errors import HeaderParseError

_TCHAR = frozenset("!#$%&'*+-.^_`|~" + string.ascii_letters + string.digits)
_TOKEN68 = frozenset("-._~+/" + string.ascii_letters + string.digits)

AuthItem = tuple[str, dict[str, str], "str | None"]  # scheme, params, token68


class _Cursor:
    __slots__ = ("text", "pos")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def peek(self) -> str:
        return "" if self.at_end() else self.text[self.pos]

    def skip(self, chars: Collection[str]) -> bool:
        start = self.pos
        while not self.at_end() and self.text[self.pos] in chars:
            self.pos += 1
        return self.pos > start

    def take(self, chars: frozenset[str], what: str) -> str:
        start = self.pos
        while not self.at_end() and self.text[self.pos] in chars:
            self.pos += 1
        if self.pos == start:
            raise HeaderParseError(f"expected {what}")
        return self.text[start : self.pos]

    def quoted_string(self) -> str:
        self.pos += 1  # opening DQUOTE
        out: list[str] = []
        while True:
            if self.at_end():
                raise HeaderParseError("unterminated quoted-string")
            ch = self.text[self.pos]
            self.pos += 1
            if ch == '"':
                return "".join(out)
            if ch == "\\":  # quoted-pair
                if self.at_end():
                    raise HeaderParseError("unterminated quoted-pair")
                ch = self.text[self.pos]
                self.pos += 1
            if not (ch == "\t" or " " <= ch <= "~" or "\x80" <= ch <= "\xff"):
                raise HeaderParseError("invalid character in quoted-string")
            out.append(ch)


def parse_auth_list(value: str) -> list[AuthItem]:
    """Split a header value into (scheme, params, token68) items; raises HeaderParseError."""
    c = _Cursor(value)
    items: list[AuthItem] = []
    while True:
        c.skip(" \t,")  # empty list elements are allowed
        if c.at_end():
            return items
        items.append(_parse_item(c))
        c.skip(" \t")
        if not c.at_end() and c.peek() != ",":
            raise HeaderParseError("expected ',' between challenges")


def _parse_item(c: _Cursor) -> AuthItem:
    scheme = c.take(_TCHAR, "auth-scheme")
    if not c.skip(" ") or c.at_end() or c.peek() == ",":
        return scheme, {}, None
    if not _param_ahead(c):
        token68 = c.take(_TOKEN68, "token68")
        while c.peek() == "=":
            token68 += "="
            c.pos += 1
        return scheme, {}, token68
    return scheme, _parse_params(c), None


def _param_ahead(c: _Cursor) -> bool:
    """Whether `token BWS "=" BWS (token / quoted-string)` starts here; consumes nothing."""
    start = c.pos
    try:
        if not c.skip(_TCHAR):
            return False
        c.skip(" \t")
        if c.peek() != "=":
            return False
        c.pos += 1
        c.skip(" \t")
        return c.peek() == '"' or (c.peek() != "" and c.peek() in _TCHAR)
    finally:
        c.pos = start


def _parse_params(c: _Cursor) -> dict[str, str]:
    params: dict[str, str] = {}
    while True:
        name = c.take(_TCHAR, "auth-param name").lower()
        c.skip(" \t")
        if c.peek() != "=":
            raise HeaderParseError("expected '=' in auth-param")
        c.pos += 1
        c.skip(" \t")
        value = c.quoted_string() if c.peek() == '"' else c.take(_TCHAR, "auth-param value")
        if name in params:
            raise HeaderParseError("duplicate auth-param")
        params[name] = value
        mark = c.pos
        c.skip(" \t")
        if c.peek() != ",":
            c.pos = mark
            return params
        c.skip(" \t,")
        if c.at_end() or not _param_ahead(c):  # the comma ended this challenge
            c.pos = mark
            return params
