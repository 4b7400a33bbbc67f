"""`--shape buckets` with a stream tick (the default): a shaped stream on the node's timer, what
the hops see is a grid of equal chunks; whole responses in size buckets (framing/buckets.py).

    head + first chunk   on the first tick at least the request's prefill budget after it arrived
                         (privacy/shape.py: first_tick), never at the moment of the first token
    one chunk per tick   STREAM_CHUNK plaintext bytes: the SSE bytes that arrived since the last
                         tick, filled out (a tick with nothing new sends filler only)
    the end              after the last content, filler chunks up to the stream's decode budget
                         (max_tokens x a budget per token; without one, or past it, to a
                         power-of-two number of ticks: shape.padded_ticks), then the final chunk

So the relay sees when a stream starts to within the budget's tick (a prefill longer than the
budget still shows, rounded up to a tick) and not how long its answer was.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from starlette.responses import StreamingResponse

from traceless.node.framing.base import END_LEN, Arrival, Headers
from traceless.node.framing.buckets import BucketFramer
from traceless.privacy.bhttp.stream import ResponseStreamEncoder
from traceless.privacy.ohttp.chunked import ChunkedServerResponse
from traceless.privacy.ohttp.media import OHTTP_CHUNKED_RES
from traceless.privacy.shape import STREAM_CHUNK, ShapePolicy, content_room, first_tick, pack, padded_ticks, sse_filler


@dataclass(frozen=True, slots=True)
class Pace:
    first_due: float  # loop time of the first tick: the head and the first chunk
    tick_s: float
    budget_ticks: int | None  # the stream's length if its content ends within it (None: pow2 ticks)


# A shaped stream holds the engine's idle work off for this many ticks past each tick it sends: a
# late tick (a loaded machine) does not let it in mid-stream; a stream that ends lets it in soon.
IDLE_HOLD_TICKS = 3


class PacedFramer(BucketFramer):
    """Whole responses as BucketFramer; chunked ones on the tick grid of `policy`. `defer_idle(s)`
    (AsyncEngine.defer_idle) keeps the engine's idle work (collection, scrubbing) off for s seconds:
    work done between a stream's ticks would show in their gaps."""

    def __init__(self, policy: ShapePolicy, max_model_len: int,
                 defer_idle: Callable[[float], None] | None = None):
        self.policy, self.max_model_len = policy, max_model_len
        self.defer_idle = defer_idle or (lambda seconds: None)

    async def stream(self, ctx: ChunkedServerResponse, status: int, headers: Headers,
                     events: AsyncGenerator[bytes, None], req: Arrival,
                     filler: Callable[[int], bytes]) -> StreamingResponse:
        pace = self._pace(req, filler is sse_filler)
        wait = pace.first_due - asyncio.get_running_loop().time()
        # the engine's idle work waits for the stream's end: from now to the first tick, then a few
        # ticks past each tick
        self.defer_idle(max(0.0, wait) + IDLE_HOLD_TICKS * pace.tick_s)
        try:  # the response head leaves on the first tick, not when the first token is known
            await asyncio.sleep(wait)
        except BaseException:
            await events.aclose()  # the client left: the engine request is aborted
            raise
        body = paced(ctx, status, headers, events, pace, filler)
        return StreamingResponse(self._holding_idle(body, pace.tick_s), media_type=OHTTP_CHUNKED_RES)

    async def _holding_idle(self, body: AsyncGenerator[bytes, None], tick_s: float) -> AsyncGenerator[bytes, None]:
        """The paced stream, holding the engine's idle work off at every tick."""
        try:
            async for chunk in body:
                self.defer_idle(IDLE_HOLD_TICKS * tick_s)
                yield chunk
        finally:
            await body.aclose()

    def _pace(self, req: Arrival, sse: bool) -> Pace:
        tick = self.policy.tick_ms / 1000
        # no prompt longer than the context needs a longer prefill budget (8 bytes a token: token-id lists)
        budget = self.policy.prefill_budget_s(req.request_bytes, 8 * self.max_model_len)
        due = first_tick(req.arrived, asyncio.get_running_loop().time(), tick, budget)
        # a JSON body comes whole at the end (its time shows anyway): powers of two only
        return Pace(due, tick, self.policy.decode_budget_ticks(req.max_tokens) if sse else None)


async def paced(ctx: ChunkedServerResponse, status: int, headers: Headers, events: AsyncGenerator[bytes, None],
                pace: Pace, filler: Callable[[int], bytes]) -> AsyncGenerator[bytes, None]:
    """One STREAM_CHUNK-byte chunk per tick, from pace.first_due: what arrived since the last tick."""
    loop = asyncio.get_running_loop()
    enc, msg = ctx.encryptor(), ResponseStreamEncoder()
    pending = bytearray()

    async def pump() -> None:
        async for event in events:
            pending.extend(event)

    task = asyncio.create_task(pump())
    try:
        due = pace.first_due
        await asyncio.sleep(due - loop.time())
        head = msg.head(status, headers)
        chunk, took = pack(pending, STREAM_CHUNK - len(head), filler)
        del pending[:took]
        yield enc.seal_chunk(head + chunk)
        sent, last, target = 1, content_room(STREAM_CHUNK - END_LEN), None
        while True:
            due += pace.tick_s
            await asyncio.sleep(due - loop.time())
            if task.done() and task.exception() is not None:
                raise RuntimeError("the response stream failed")  # the client sees a truncated stream
            if task.done() and len(pending) <= last:
                target = target or padded_ticks(sent + 1, pace.budget_ticks)  # if this tick were the last
                if sent + 1 >= target:
                    chunk, _ = pack(pending, STREAM_CHUNK - END_LEN, filler)
                    yield enc.seal_final(chunk + msg.end())
                    return
            chunk, took = pack(pending, STREAM_CHUNK, filler)
            del pending[:took]
            yield enc.seal_chunk(chunk)
            sent += 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await events.aclose()
        pending[:] = bytes(len(pending))
