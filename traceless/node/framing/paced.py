"""`--shape buckets` with a stream tick (the default): a shaped stream on the node's timer, what
the hops see is a grid of equal chunks; whole responses in size buckets (framing/buckets.py).

    the grid             every chunk leaves at first_due + k x tick: instants fixed when the request
                         arrived, never moved by when the inner response or its tokens come
    head + first chunk   on the first tick at least the request's prefill budget after it arrived
                         (privacy/shape.py: first_tick), whether or not the first token is known
    one chunk per tick   STREAM_CHUNK plaintext bytes, built and sealed by the same code on every
                         tick: the SSE bytes that arrived since the last tick, filled out (a tick
                         with nothing new sends filler only); before the inner head is known (a
                         prefill longer than its budget), an informational (1xx) response of padding,
                         which every binary HTTP decoder skips
    the end              after the last content, filler chunks up to the stream's decode budget
                         (max_tokens x a budget per token; without one, or past it, to a
                         power-of-two number of ticks: shape.padded_ticks), then the final chunk

So the relay sees when a stream starts to within the budget, whatever the prefill took, and not how
long its answer was. What the grid cannot hide is a tick the event loop runs late (a loaded
machine): the chunk still leaves, late, and the next one is due at its own instant.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from starlette.responses import StreamingResponse

from traceless.node.framing.base import END_LEN, Arrival, Inner, discard
from traceless.node.framing.buckets import BucketFramer
from traceless.privacy.bhttp.stream import ResponseStreamEncoder
from traceless.privacy.ohttp.chunked import ChunkedServerResponse
from traceless.privacy.ohttp.media import OHTTP_CHUNKED_RES
from traceless.privacy.shape import STREAM_CHUNK, ShapePolicy, content_room, first_tick, pack, padded_ticks, sse_filler


@dataclass(frozen=True, slots=True)
class Pace:
    first_due: float  # loop time of the first tick: the head and the first chunk
    tick_s: float


# A shaped stream holds the engine's idle work off for this many ticks past each tick it sends: a
# late tick (a loaded machine) does not let it in mid-stream; a stream that ends lets it in soon.
IDLE_HOLD_TICKS = 3
LAST_ROOM = content_room(STREAM_CHUNK - END_LEN)  # content the final chunk can carry


class PacedFramer(BucketFramer):
    """Whole responses as BucketFramer; chunked ones on the tick grid of `policy`. `defer_idle(s)`
    (AsyncEngine.defer_idle) keeps the engine's idle work (collection, scrubbing) off for s seconds:
    work done between a stream's ticks would show in their gaps."""

    def __init__(self, policy: ShapePolicy, max_model_len: int, defer_idle: Callable[[float], None] | None = None):
        self.policy, self.max_model_len = policy, max_model_len
        self.defer_idle = defer_idle or (lambda seconds: None)

    async def stream(self, ctx: ChunkedServerResponse, inner: asyncio.Future[Inner], req: Arrival) -> StreamingResponse:
        pace = self._pace(req)
        wait = pace.first_due - asyncio.get_running_loop().time()
        # the engine's idle work waits for the stream's end: from now to the first tick, then a few
        # ticks past each tick
        self.defer_idle(max(0.0, wait) + IDLE_HOLD_TICKS * pace.tick_s)
        try:  # the response head leaves on the first tick, whether or not the inner one is known
            await asyncio.sleep(wait)
        except BaseException:
            await discard(inner)  # the client left: the engine request is aborted
            raise

        def budget(got: Inner) -> int | None:  # a JSON body comes whole at the end (its time shows): pow2
            return self.policy.decode_budget_ticks(req.max_tokens) if got.filler is sse_filler else None

        body = paced(ctx, inner, pace, budget)
        return StreamingResponse(self._holding_idle(body, pace.tick_s), media_type=OHTTP_CHUNKED_RES)

    async def _holding_idle(self, body: AsyncGenerator[bytes, None], tick_s: float) -> AsyncGenerator[bytes, None]:
        """The paced stream, holding the engine's idle work off at every tick."""
        try:
            async for chunk in body:
                self.defer_idle(IDLE_HOLD_TICKS * tick_s)
                yield chunk
        finally:
            await body.aclose()

    def _pace(self, req: Arrival) -> Pace:
        tick = self.policy.tick_ms / 1000
        # no prompt longer than the context needs a longer prefill budget (8 bytes a token: token-id lists)
        budget = self.policy.prefill_budget_s(req.request_bytes, 8 * self.max_model_len)
        return Pace(first_tick(req.arrived, asyncio.get_running_loop().time(), tick, budget), tick)


class _Source:
    """The inner response as it becomes ready: its head once the inner task resolves, then the bytes
    of its body as they come (`pending`, always ending at an event boundary)."""

    def __init__(self, inner: asyncio.Future[Inner]):
        self.inner: asyncio.Future[Inner] = inner
        self.got: Inner | None = None
        self.pending = bytearray()
        self.task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        got = self.got = await asyncio.shield(self.inner)
        async for event in got.events:
            self.pending.extend(event)

    def ended(self) -> bool:
        """True when the whole body is in `pending`; raises if the inner response failed."""
        if self.task.done() and not self.task.cancelled() and self.task.exception() is not None:
            raise RuntimeError("the response stream failed")  # the client sees a truncated stream
        return self.task.done()

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await discard(self.inner)
        self.pending[:] = bytes(len(self.pending))


def frame(msg: ResponseStreamEncoder, src: _Source, total: int = STREAM_CHUNK) -> bytes:
    """One tick's plaintext, exactly `total` bytes: padding while the inner head is unknown; then the
    head (once) and what arrived since the last tick, filled out."""
    if src.got is None:
        return msg.informational(total)
    prefix = b"" if msg.head_sent else msg.head(src.got.status, src.got.headers)
    chunk, took = pack(src.pending, total - len(prefix), src.got.filler)
    del src.pending[:took]
    return prefix + chunk


async def paced(
    ctx: ChunkedServerResponse, inner: asyncio.Future[Inner], pace: Pace, budget: Callable[[Inner], int | None]
) -> AsyncGenerator[bytes, None]:
    """One STREAM_CHUNK-byte chunk per tick, at pace.first_due + k x pace.tick_s. `budget(inner)`:
    the stream's length in ticks if its content ends within it (None: a power of two)."""
    loop = asyncio.get_running_loop()
    enc, msg, src = ctx.encryptor(), ResponseStreamEncoder(), _Source(inner)
    try:
        sent, target = 0, None
        while True:
            await asyncio.sleep(pace.first_due + sent * pace.tick_s - loop.time())
            if src.ended() and msg.head_sent and len(src.pending) <= LAST_ROOM and src.got is not None:
                target = target or padded_ticks(sent + 1, budget(src.got))  # if this tick were the last
                if sent + 1 >= target:
                    chunk, _ = pack(src.pending, STREAM_CHUNK - END_LEN, src.got.filler)
                    yield enc.seal_final(chunk + msg.end())
                    return
            yield enc.seal_chunk(frame(msg, src))
            sent += 1
    finally:
        await src.close()
