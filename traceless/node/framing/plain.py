"""`--shape off`: lengths and timings as they are, or every chunk one size (`--stream-padding`).

Without padding, one content chunk per SSE event, sent when it is ready. With padding P (an SSE
event already padded to P bytes by the server's formatter), every chunk's plaintext is the same
size: data chunks carry one padded event, and the head and the final chunk are filled out to it
with an SSE comment; a whole response's binary HTTP message is zero-padded to a multiple of P.
"""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse

from traceless.node.framing.base import END_LEN, Arrival, Framer, Inner, resolved
from traceless.privacy.bhttp.stream import ResponseStreamEncoder
from traceless.privacy.ohttp.chunked import ChunkedServerResponse
from traceless.privacy.ohttp.media import OHTTP_CHUNKED_RES
from traceless.privacy.wire import encode_varint
from traceless.server.stream_shape import padding_event


class PlainFramer(Framer):
    def __init__(self, padding: int = 0):
        self.padding = padding  # bytes per chunk (the server's stream padding); 0: none

    def whole_padding(self, length: int) -> int:
        # whole responses too: their length would tell the output's length
        return -length % self.padding if self.padding else 0

    async def stream(self, ctx: ChunkedServerResponse, inner: asyncio.Future[Inner], req: Arrival) -> StreamingResponse:
        padding = self.padding
        got = await resolved(inner)
        status, headers, events = got.status, got.headers, got.events

        async def gen():
            enc, msg = ctx.encryptor(), ResponseStreamEncoder()
            size = len(encode_varint(padding)) + padding if padding else 0
            try:
                yield enc.seal_chunk(_fill(msg.head(status, headers), size, msg))
                async for event in events:
                    yield enc.seal_chunk(msg.chunk(event))
                tail = _fill(b"", size - END_LEN, msg) if size else b""  # before end(): chunks precede it
                yield enc.seal_final(tail + msg.end())
            finally:
                await events.aclose()

        return StreamingResponse(gen(), media_type=OHTTP_CHUNKED_RES)


def _fill(prefix: bytes, size: int, msg: ResponseStreamEncoder) -> bytes:
    """prefix + one content chunk holding an SSE comment, `size` bytes in all (prefix alone if
    size is 0 or too small to hold a comment)."""
    for varint_len in (1, 2, 4):
        room = size - len(prefix) - varint_len
        if room >= 4 and len(encode_varint(room)) == varint_len:
            return prefix + msg.chunk(padding_event(room))
    return prefix
