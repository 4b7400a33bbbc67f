"""Batch framing for Privacy Pass issuance over HTTP (docs/private-path.md, "Token issuer").

    application/private-token-batch-request   = (uint16 length || TokenRequest)*
    application/private-token-batch-response  = (uint16 length || TokenResponse)*, same order

One request per issuance call would cost a round trip per token; a client fetches a batch for
the current challenge instead. The framing is only lengths: each item is then decoded by the
strict structure decoders in privacypass_wire.py. Decoding refuses empty items, truncation
and trailing bytes, so a body has exactly one reading.
"""

from __future__ import annotations

from collections.abc import Sequence

from traceless.privacy.privacypass.errors import DecodeError

TOKEN_REQUEST_MEDIA_TYPE = "message/token-request"
TOKEN_RESPONSE_MEDIA_TYPE = "message/token-response"
BATCH_REQUEST_MEDIA_TYPE = "application/private-token-batch-request"
BATCH_RESPONSE_MEDIA_TYPE = "application/private-token-batch-response"
ISSUER_DIRECTORY_MEDIA_TYPE = "application/private-token-issuer-directory"
_MAX_ITEM = 0xFFFF


def encode_batch(items: Sequence[bytes]) -> bytes:
    """Concatenate `uint16 length || item` for each item, in order."""
    out = []
    for item in items:
        if not 1 <= len(item) <= _MAX_ITEM:
            raise DecodeError(f"batch items must be 1..{_MAX_ITEM} bytes")
        out.append(len(item).to_bytes(2, "big") + bytes(item))
    return b"".join(out)


def decode_batch(data: bytes) -> list[bytes]:
    """The items of a batch body; raises DecodeError on any framing fault."""
    data = bytes(data)
    items, pos = [], 0
    while pos < len(data):
        if pos + 2 > len(data):
            raise DecodeError("truncated: batch item length")
        length = int.from_bytes(data[pos : pos + 2], "big")
        pos += 2
        if length == 0:
            raise DecodeError("empty batch item")
        if pos + length > len(data):
            raise DecodeError("truncated: batch item")
        items.append(data[pos : pos + length])
        pos += length
    return items
