"""The PrivateToken HTTP authentication scheme (RFC 9577 section 2).

    WWW-Authenticate: PrivateToken challenge="<b64url TokenChallenge>",
                      token-key="<b64url key>", max-age="<seconds>"
    Authorization: PrivateToken token="<b64url Token>"

The header syntax is RFC 9110 section 11: a comma-separated list of challenges, each an
auth-scheme followed by a token68 or by comma-separated auth-params, so the parser has to
look ahead after each comma to tell "next parameter" from "next challenge". Scheme and
parameter names are case-insensitive; values may be tokens or quoted-strings. Base64url
values are emitted padded (the RFC's MUST); on input both padded and unpadded forms are
accepted, but only in canonical form.

PrivateToken challenges that cannot be used (no or undecodable `challenge`, bad
`token-key` or `max-age`) are skipped: RFC 9577 section 2.1.2 says a client MUST NOT act on
them, and other challenges in the same header stay usable. A header that is not valid
RFC 9110 syntax at all raises HeaderParseError.
"""
from __future__ import annotations

import base64
import binascii
import string
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from traceless.privacy.privacypass_keys import IssuerPublicKey
from traceless.privacy.privacypass_wire import TOKEN_TYPE_BLIND_RSA, Token, TokenChallenge
from traceless.privacy.token_errors import DecodeError

SCHEME = "PrivateToken"
_TCHAR = frozenset("!#$%&'*+-.^_`|~" + string.ascii_letters + string.digits)
_TOKEN68 = frozenset("-._~+/" + string.ascii_letters + string.digits)
_B64URL = frozenset("-_" + string.ascii_letters + string.digits)


class HeaderParseError(DecodeError):
    """The header is not valid RFC 9110 authentication syntax, or lacks a required part."""


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def b64url_decode(text: str, what: str) -> bytes:
    """Decode padded or unpadded base64url; refuses other alphabets and non-canonical input."""
    body = text.rstrip("=")
    if not set(body) <= _B64URL or len(text) - len(body) > 2 or len(body) % 4 == 1:
        raise HeaderParseError(f"{what} is not base64url")
    try:
        data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise HeaderParseError(f"{what} is not base64url") from None
    if b64url_encode(data) not in (text, text + "=" * (-len(text) % 4)):
        raise HeaderParseError(f"{what} is not canonical base64url")
    return data


@dataclass(frozen=True, slots=True)
class PrivateTokenChallenge:
    """One PrivateToken challenge from a WWW-Authenticate header.

    `challenge` stays encoded: its structure depends on the token type, and clients must
    ignore types they do not support. token_key is None when the origin leaves it out.
    """

    challenge: bytes
    token_key: bytes | None = None
    max_age: int | None = None

    def __post_init__(self) -> None:
        if len(self.challenge) < 2:
            raise DecodeError("challenge shorter than its token_type")
        if self.max_age is not None and self.max_age < 0:
            raise DecodeError("max-age must not be negative")

    @property
    def token_type(self) -> int:
        return int.from_bytes(self.challenge[:2], "big")

    def to_header_element(self) -> str:
        parts = [f'{SCHEME} challenge="{b64url_encode(self.challenge)}"']
        if self.token_key is not None:
            parts.append(f'token-key="{b64url_encode(self.token_key)}"')
        if self.max_age is not None:
            parts.append(f'max-age="{self.max_age}"')
        return ", ".join(parts)


def format_www_authenticate(challenges: Sequence[PrivateTokenChallenge]) -> str:
    """The WWW-Authenticate value; the first challenge is the origin's preference."""
    if not challenges:
        raise ValueError("at least one challenge is needed")
    return ", ".join(c.to_header_element() for c in challenges)


def parse_www_authenticate(value: str) -> list[PrivateTokenChallenge]:
    """The usable PrivateToken challenges in a WWW-Authenticate value, in header order."""
    out = []
    for scheme, params, token68 in _parse_auth_list(value):
        if scheme.lower() != SCHEME.lower() or token68 is not None:
            continue
        try:
            out.append(_challenge_from_params(params))
        except DecodeError:
            continue  # unusable challenge: ignored, the others still count (see module doc)
    return out


def format_authorization(token: Token) -> str:
    return f'{SCHEME} token="{b64url_encode(token.encode())}"'


def parse_authorization(value: str) -> Token:
    """The Token in an `Authorization: PrivateToken token=...` value; unknown params ignored."""
    items = _parse_auth_list(value)
    if len(items) != 1:
        raise HeaderParseError("Authorization must hold exactly one credential")
    scheme, params, _ = items[0]
    if scheme.lower() != SCHEME.lower():
        raise HeaderParseError("Authorization scheme is not PrivateToken")
    if "token" not in params:
        raise HeaderParseError("PrivateToken credential has no token parameter")
    return Token.decode(b64url_decode(params["token"], "token"))


@dataclass(frozen=True, slots=True)
class SelectedChallenge:
    challenge: TokenChallenge
    max_age: int | None


def choose_challenge(
    challenges: Sequence[PrivateTokenChallenge], origin_name: str, issuer_key: IssuerPublicKey
) -> SelectedChallenge | None:
    """The first challenge a type-2 client may answer (RFC 9577 section 2.1.2), or None.

    A usable challenge has token type 2, a well-formed TokenChallenge, origin_info that is
    empty or lists origin_name (case-insensitively), and a token-key that is absent or equal
    to issuer_key. issuer_key comes from the client's own configuration, never from the
    origin: a per-client key handed out by an untrusted origin could tag that client.
    """
    for candidate in challenges:
        if candidate.token_type != TOKEN_TYPE_BLIND_RSA:
            continue
        if candidate.token_key is not None and candidate.token_key != issuer_key.spki:
            continue
        try:
            challenge = TokenChallenge.decode(candidate.challenge)
        except DecodeError:
            continue
        origins = [name.lower() for name in challenge.origin_names()]
        if origins and origin_name.lower() not in origins:
            continue
        return SelectedChallenge(challenge, candidate.max_age)
    return None


def _challenge_from_params(params: dict[str, str]) -> PrivateTokenChallenge:
    if "challenge" not in params:
        raise HeaderParseError("PrivateToken challenge has no challenge parameter")
    challenge = b64url_decode(params["challenge"], "challenge")
    token_key = None
    if "token-key" in params:
        token_key = b64url_decode(params["token-key"], "token-key")
    max_age = None
    if "max-age" in params:
        if not params["max-age"].isascii() or not params["max-age"].isdigit():
            raise HeaderParseError("max-age is not a number of seconds")
        max_age = int(params["max-age"])
    return PrivateTokenChallenge(challenge, token_key, max_age)


# --- RFC 9110 section 11 list syntax ------------------------------------------------------
#   challenge  = auth-scheme [ 1*SP ( token68 / #auth-param ) ]
#   auth-param = token BWS "=" BWS ( token / quoted-string )

_AuthItem = tuple[str, dict[str, str], "str | None"]  # scheme, params, token68


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
        out = []
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


def _parse_auth_list(value: str) -> list[_AuthItem]:
    c = _Cursor(value)
    items: list[_AuthItem] = []
    while True:
        c.skip(" \t,")  # empty list elements are allowed
        if c.at_end():
            return items
        items.append(_parse_item(c))
        c.skip(" \t")
        if not c.at_end() and c.peek() != ",":
            raise HeaderParseError("expected ',' between challenges")


def _parse_item(c: _Cursor) -> _AuthItem:
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
