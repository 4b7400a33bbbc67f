"""The PrivateToken HTTP authentication scheme (RFC 9577 section 2).

    WWW-Authenticate: PrivateToken challenge="<b64url TokenChallenge>",
                      token-key="<b64url key>", max-age="<seconds>"
    Authorization: PrivateToken token="<b64url Token>"

The header grammar (RFC 9110 section 11) is in http_auth_syntax.py. Scheme and parameter
names are case-insensitive; values may be tokens or quoted-strings. Base64url values are
emitted padded (the RFC's MUST); on input both padded and unpadded forms are accepted,
but only in canonical form.

PrivateToken challenges that cannot be used (no or undecodable `challenge`, bad
`token-key` or `max-age`) are skipped: RFC 9577 section 2.1.2 says a client MUST NOT act on
them, and other challenges in the same header stay usable. A header that is not valid
RFC 9110 syntax at all raises HeaderParseError.
"""

from __future__ import annotations

import base64
import binascii
import string
from collections.abc import Sequence
from dataclasses import dataclass

from traceless.privacy.privacypass.auth_syntax import parse_auth_list
from traceless.privacy.privacypass.errors import DecodeError, HeaderParseError
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.wire import TOKEN_TYPE_BLIND_RSA, Token, TokenChallenge

SCHEME = "PrivateToken"
_B64URL = frozenset("-_" + string.ascii_letters + string.digits)


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
    for scheme, params, token68 in parse_auth_list(value):
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
    items = parse_auth_list(value)
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
    """The challenge a client chose to answer, and how long the origin says it is good for."""

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
