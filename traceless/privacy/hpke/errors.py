"""HPKE's own errors (RFC 9180); the opaque `DecryptError` and the algorithm and parsing errors it
shares with Binary HTTP and OHTTP live in `traceless.privacy.errors`."""

from __future__ import annotations

from traceless.errors import TracelessError


class SequenceOverflowError(TracelessError):
    """A context or chunk counter reached its nonce-space limit (RFC 9180 §5.2)."""
