"""`--shape buckets --stream-tick 0`: sizes in buckets, timings as they are.

A whole response's binary HTTP message is zero-padded to its size bucket (RFC 9292 §3.8); a
chunked one sends one chunk per event as it comes, each padded to its size bucket, the head and
the final chunk filled out to STREAM_CHUNK.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from starlette.responses import StreamingResponse

from traceless.node.framing.base import END_LEN, Arrival, Framer, Headers, Inner, resolved
from traceless.privacy.bhttp.stream import ResponseStreamEncoder
from traceless.privacy.ohttp.chunked import ChunkedServerResponse
from traceless.privacy.ohttp.media import OHTTP_CHUNKED_RES
from traceless.privacy.shape import STREAM_CHUNK, bucket_for, bucket_padding, pack


class BucketFramer(Framer):
    def whole_padding(self, length: int) -> int:
        return bucket_padding(length)  # its length would tell the output's length

    async def stream(self, ctx: ChunkedServerResponse, inner: asyncio.Future[Inner], req: Arrival) -> StreamingResponse:
        got = await resolved(inner)  # timings are not hidden in this mode: the head leaves when it is known
        return StreamingResponse(
            bucketed(ctx, got.status, got.headers, got.events, got.filler), media_type=OHTTP_CHUNKED_RES
        )


async def bucketed(
    ctx: ChunkedServerResponse,
    status: int,
    headers: Headers,
    events: AsyncGenerator[bytes, None],
    filler: Callable[[int], bytes],
) -> AsyncGenerator[bytes, None]:
    """One chunk per event as it comes, each padded to its size bucket."""
    enc, msg = ctx.encryptor(), ResponseStreamEncoder()
    pending = bytearray()
    try:
        head = msg.head(status, headers)
        yield enc.seal_chunk(head + pack(pending, STREAM_CHUNK - len(head), filler)[0])
        async for event in events:
            pending.extend(event)
            while pending:
                size = bucket_for(len(pending) + 8)
                chunk, took = pack(pending, size, filler)
                del pending[:took]
                yield enc.seal_chunk(chunk)
        yield enc.seal_final(pack(pending, STREAM_CHUNK - END_LEN, filler)[0] + msg.end())
    finally:
        await events.aclose()
        pending[:] = bytes(len(pending))
