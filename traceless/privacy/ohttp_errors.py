"""Typed errors of the encapsulation stack: HPKE (RFC 9180), Binary HTTP (RFC 9292) and
Oblivious HTTP (RFC 9458, draft-ietf-ohai-chunked-ohttp).

Two rules shape this module:

* Every authentication failure is one opaque `DecryptError` with one fixed message. Whether the
  KEM rejected `enc`, the tag did not verify, a chunk was cut short or bytes followed the final
  chunk, the caller (and anyone who sees the error) learns only "decryption failed".
* Messages describe the *shape* of a problem (a field name, a length, a limit), never content:
  these errors reach logs and HTTP replies, which must carry no plaintext or key material.
"""
from __future__ import annotations

from traceless.errors import InvalidRequestError, TracelessError

_DECRYPT_FAILED = "decryption failed"


class DecryptError(TracelessError):
    """Opaque failure to authenticate or decrypt (HTTP 400). Never says which check failed."""

    def __init__(self) -> None:
        super().__init__(_DECRYPT_FAILED)


class SequenceOverflowError(TracelessError):
    """A context or chunk counter reached its nonce-space limit (RFC 9180 §5.2)."""


class ChunkError(TracelessError, ValueError):
    """A chunk that may not be sealed: an empty non-final chunk, or anything after the final one."""


class UnsupportedAlgorithmError(InvalidRequestError):
    """A KEM, KDF or AEAD identifier this library does not implement or the key does not allow."""


class MalformedMessageError(InvalidRequestError):
    """Bytes that do not parse: truncated, trailing data, a field out of its range (HTTP 400)."""


class BhttpError(MalformedMessageError):
    """A binary HTTP message (RFC 9292) is invalid, or cannot be encoded as given."""


class KeyConfigError(MalformedMessageError):
    """A key configuration or `application/ohttp-keys` body (RFC 9458 §3) is malformed."""


class UnknownKeyIdError(InvalidRequestError):
    """An encapsulated request names a key id this gateway does not hold (RFC 9458 §5.3)."""


class MessageTooLargeError(InvalidRequestError):
    """An encapsulated message or chunk exceeds the configured limit (HTTP 413)."""


# Everything decapsulation, encapsulation or binary HTTP parsing can raise about a message.
OHTTP_ERRORS = (DecryptError, ChunkError, UnsupportedAlgorithmError, MalformedMessageError, UnknownKeyIdError,
                MessageTooLargeError)
