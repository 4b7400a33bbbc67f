"""What any hop reads of an encrypted response: the OHTTP chunk framing, in the clear."""

from __future__ import annotations

from traceless.privacy.wire import peek_varint


def chunked_ciphertexts(body: bytes, nonce_len: int = 16) -> list[int]:
    """Lengths of the sealed chunks of a message/ohttp-chunked-res (framing only, no keys)."""
    pos, sizes = nonce_len, []
    while pos < len(body):
        got = peek_varint(body[pos:])
        if got is None:  # a body cut inside a chunk's length
            break
        length, n = got
        pos += n
        if length == 0:  # the final chunk: the rest of the body
            sizes.append(len(body) - pos)
            break
        sizes.append(length)
        pos += length
    return sizes
