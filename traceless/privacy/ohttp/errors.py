"""Oblivious HTTP's errors (RFC 9458, draft-ietf-ohai-chunked-ohttp), and `OHTTP_ERRORS`: every
error decapsulation, encapsulation or binary HTTP parsing can raise about a message."""

from __future__ import annotations

from traceless.errors import InvalidRequestError, TracelessError
from traceless.privacy.errors import DecryptError, MalformedMessageError, UnsupportedAlgorithmError


class ChunkError(TracelessError, ValueError):
    """A chunk that may not be sealed: an empty non-final chunk, or anything after the final one."""


class KeyConfigError(MalformedMessageError):
    """A key configuration or `application/ohttp-keys` body (RFC 9458 §3) is malformed."""


class UnknownKeyIdError(InvalidRequestError):
    """An encapsulated request names a key id this gateway does not hold (RFC 9458 §5.3)."""


class MessageTooLargeError(InvalidRequestError):
    """An encapsulated message or chunk exceeds the configured limit (HTTP 413)."""


OHTTP_ERRORS = (
    DecryptError,
    ChunkError,
    UnsupportedAlgorithmError,
    MalformedMessageError,
    UnknownKeyIdError,
    MessageTooLargeError,
)
