"""Privacy Pass wire structures (RFC 9577 section 2, RFC 9578 section 6), TLS presentation.

    TokenChallenge  uint16 token_type; opaque issuer_name<1..2^16-1>;
                    opaque redemption_context<0..32>; opaque origin_info<0..2^16-1>
    TokenRequest    uint16 token_type = 2; uint8 truncated_token_key_id; uint8 blinded_msg[Nk]
    TokenResponse   uint8 blind_sig[Nk]
    Token           uint16 token_type; uint8 nonce[32]; uint8 challenge_digest[32];
                    uint8 token_key_id[Nid]; uint8 authenticator[Nk]

Decoding is strict: exact lengths, no trailing bytes, so every structure has exactly one
encoding. Only token type 0x0002 (blind RSA 2048) has its request, response and token
sizes defined here; the TokenChallenge is the default structure, parsed for any type.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from traceless.privacy.privacypass.errors import DecodeError, UnsupportedTokenTypeError

TOKEN_TYPE_BLIND_RSA = 0x0002
NK = 256  # authenticator / blinded message length for type 2 (RSA-2048)
NID = 32  # token_key_id length
NONCE_LEN = 32
DIGEST_LEN = 32  # challenge_digest = SHA-256(TokenChallenge)
REDEMPTION_CONTEXT_LENS = (0, 32)


class _Reader:
    """Cursor over a byte string; every read checks the bytes are there."""

    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = bytes(data)
        self._pos = 0

    def read(self, n: int, what: str) -> bytes:
        if self._pos + n > len(self._data):
            raise DecodeError(f"truncated: {what}")
        out = self._data[self._pos : self._pos + n]
        self._pos += n
        return out

    def uint(self, size: int, what: str) -> int:
        return int.from_bytes(self.read(size, what), "big")

    def vector(self, len_size: int, what: str) -> bytes:
        return self.read(self.uint(len_size, f"{what} length"), what)

    def finish(self, what: str) -> None:
        if self._pos != len(self._data):
            raise DecodeError(f"trailing bytes after {what}")


def _ascii(raw: bytes, what: str) -> str:
    """Decode a server-name field: printable ASCII, no spaces (RFC 9577 section 2.1.1)."""
    if any(b < 0x21 or b > 0x7E for b in raw):
        raise DecodeError(f"{what} is not printable ASCII")
    return raw.decode("ascii")


def _check_ascii(value: str, what: str) -> None:
    if not isinstance(value, str) or any(not 0x21 <= ord(c) <= 0x7E for c in value):
        raise DecodeError(f"{what} is not printable ASCII")


def _check_type2(token_type: int, what: str) -> None:
    if token_type != TOKEN_TYPE_BLIND_RSA:
        raise UnsupportedTokenTypeError(f"{what}: unsupported token_type 0x{token_type:04x}")


def _check_len(value: bytes, length: int, what: str) -> None:
    if not isinstance(value, bytes) or len(value) != length:
        raise DecodeError(f"{what} must be {length} bytes")


@dataclass(frozen=True, slots=True)
class TokenChallenge:
    """The origin's challenge (RFC 9577 section 2.1.1); names are ASCII server names."""

    token_type: int
    issuer_name: str
    redemption_context: bytes
    origin_info: str

    def __post_init__(self) -> None:
        if not 0 <= self.token_type <= 0xFFFF:
            raise DecodeError("token_type out of range")
        _check_ascii(self.issuer_name, "issuer_name")
        if not 1 <= len(self.issuer_name) <= 0xFFFF:
            raise DecodeError("issuer_name must be 1..65535 bytes")
        if (
            not isinstance(self.redemption_context, bytes)
            or len(self.redemption_context) not in REDEMPTION_CONTEXT_LENS
        ):
            raise DecodeError("redemption_context must be 0 or 32 bytes")
        _check_ascii(self.origin_info, "origin_info")
        if len(self.origin_info) > 0xFFFF:
            raise DecodeError("origin_info longer than 65535 bytes")

    def origin_names(self) -> list[str]:
        """The origins this challenge is scoped to; empty means cross-origin."""
        return self.origin_info.split(",") if self.origin_info else []

    def encode(self) -> bytes:
        issuer = self.issuer_name.encode("ascii")
        origins = self.origin_info.encode("ascii")
        return b"".join(
            (
                self.token_type.to_bytes(2, "big"),
                len(issuer).to_bytes(2, "big"),
                issuer,
                len(self.redemption_context).to_bytes(1, "big"),
                self.redemption_context,
                len(origins).to_bytes(2, "big"),
                origins,
            )
        )

    def digest(self) -> bytes:
        """challenge_digest = SHA-256(TokenChallenge)."""
        return hashlib.sha256(self.encode()).digest()

    @classmethod
    def decode(cls, data: bytes) -> TokenChallenge:
        r = _Reader(data)
        token_type = r.uint(2, "token_type")
        issuer = _ascii(r.vector(2, "issuer_name"), "issuer_name")
        context = r.vector(1, "redemption_context")
        origins = _ascii(r.vector(2, "origin_info"), "origin_info")
        r.finish("TokenChallenge")
        return cls(token_type, issuer, context, origins)


@dataclass(frozen=True, slots=True)
class TokenRequest:
    """Client-to-issuer request (RFC 9578 section 6.1)."""

    token_type: int
    truncated_token_key_id: int
    blinded_msg: bytes

    def __post_init__(self) -> None:
        _check_type2(self.token_type, "TokenRequest")
        if not 0 <= self.truncated_token_key_id <= 0xFF:
            raise DecodeError("truncated_token_key_id must be one byte")
        _check_len(self.blinded_msg, NK, "blinded_msg")

    def encode(self) -> bytes:
        return self.token_type.to_bytes(2, "big") + bytes([self.truncated_token_key_id]) + self.blinded_msg

    @classmethod
    def decode(cls, data: bytes) -> TokenRequest:
        r = _Reader(data)
        token_type = r.uint(2, "token_type")
        _check_type2(token_type, "TokenRequest")
        truncated = r.uint(1, "truncated_token_key_id")
        blinded_msg = r.read(NK, "blinded_msg")
        r.finish("TokenRequest")
        return cls(token_type, truncated, blinded_msg)


@dataclass(frozen=True, slots=True)
class TokenResponse:
    """Issuer-to-client response (RFC 9578 section 6.2)."""

    blind_sig: bytes

    def __post_init__(self) -> None:
        _check_len(self.blind_sig, NK, "blind_sig")

    def encode(self) -> bytes:
        return self.blind_sig

    @classmethod
    def decode(cls, data: bytes) -> TokenResponse:
        r = _Reader(data)
        blind_sig = r.read(NK, "blind_sig")
        r.finish("TokenResponse")
        return cls(blind_sig)


@dataclass(frozen=True, slots=True)
class Token:
    """The redeemed token (RFC 9577 section 2.2) for token type 2."""

    token_type: int
    nonce: bytes
    challenge_digest: bytes
    token_key_id: bytes
    authenticator: bytes

    def __post_init__(self) -> None:
        _check_type2(self.token_type, "Token")
        _check_len(self.nonce, NONCE_LEN, "nonce")
        _check_len(self.challenge_digest, DIGEST_LEN, "challenge_digest")
        _check_len(self.token_key_id, NID, "token_key_id")
        _check_len(self.authenticator, NK, "authenticator")

    def authenticator_input(self) -> bytes:
        """token_type || nonce || challenge_digest || token_key_id: the signed message."""
        return token_input(self.nonce, self.challenge_digest, self.token_key_id)

    def encode(self) -> bytes:
        return self.authenticator_input() + self.authenticator

    @classmethod
    def decode(cls, data: bytes) -> Token:
        r = _Reader(data)
        token_type = r.uint(2, "token_type")
        _check_type2(token_type, "Token")
        nonce = r.read(NONCE_LEN, "nonce")
        digest = r.read(DIGEST_LEN, "challenge_digest")
        key_id = r.read(NID, "token_key_id")
        authenticator = r.read(NK, "authenticator")
        r.finish("Token")
        return cls(token_type, nonce, digest, key_id, authenticator)


def token_input(nonce: bytes, challenge_digest: bytes, token_key_id: bytes) -> bytes:
    """concat(0x0002, nonce, challenge_digest, token_key_id) (RFC 9578 section 6.1)."""
    return TOKEN_TYPE_BLIND_RSA.to_bytes(2, "big") + nonce + challenge_digest + token_key_id
