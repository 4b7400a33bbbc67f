"""Errors shared by the encapsulation stack: HPKE (RFC 9180), Binary HTTP (RFC 9292) and Oblivious
HTTP (RFC 9458). Each sub-package adds its own (`hpke/errors.py`, `bhttp/errors.py`,
`ohttp/errors.py`) on top of these.

Two rules shape them:

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


class UnsupportedAlgorithmError(InvalidRequestError):
    """A KEM, KDF or AEAD identifier this library does not implement or the key does not allow."""


class MalformedMessageError(InvalidRequestError):
    """Bytes that do not parse: truncated, trailing data, a field out of its range (HTTP 400)."""
