"""Binary HTTP's errors (RFC 9292)."""

from __future__ import annotations

from traceless.privacy.errors import MalformedMessageError


class BhttpError(MalformedMessageError):
    """A binary HTTP message (RFC 9292) is invalid, or cannot be encoded as given."""
