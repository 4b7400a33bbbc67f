"""What every framer of the node's return leg shares: the request's arrival, the interface.

A framer turns one inner response (its status and JSON body, or a stream of SSE events) into what
leaves the node: an encapsulated whole response (message/ohttp-res) or a chunked one
(message/ohttp-chunked-res). What the hops may learn of a response's size and timing is decided
here and nowhere else; one framer per shape mode (framing/__init__.py chooses it once).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from starlette.responses import Response, StreamingResponse

from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.ohttp.chunked import ChunkedServerResponse
from traceless.privacy.ohttp.gateway import ServerResponse
from traceless.privacy.ohttp.media import OHTTP_RES

Headers = tuple[tuple[bytes, bytes], ...]
END_LEN = 2  # content terminator + empty trailer section


@dataclass(slots=True)
class Arrival:
    """What a shaped stream's timing is set from: when the request arrived, its padded length, and
    how many token events its longest answer has (max_tokens x n)."""

    arrived: float
    request_bytes: int
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Inner:
    """An inner response to a chunked request: its status and head fields, and its body as it comes
    (SSE events, or one JSON document); `filler(n)` gives n bytes the body's parser ignores (an SSE
    comment or JSON whitespace)."""

    status: int
    headers: Headers
    events: AsyncGenerator[bytes, None]
    filler: Callable[[int], bytes]


async def discard(inner: asyncio.Future[Inner]) -> None:
    """The stream will not be sent (the client left): stop the inner work, or close its events."""
    if not inner.done():
        inner.cancel()
    await asyncio.gather(inner, return_exceptions=True)
    if not inner.cancelled() and inner.exception() is None:
        await inner.result().events.aclose()


async def resolved(inner: asyncio.Future[Inner]) -> Inner:
    """The inner response, for a framer that sends nothing before its head; discarded if the wait is."""
    try:
        return await asyncio.shield(inner)
    except BaseException:
        await discard(inner)
        raise


class Framer(ABC):
    """One shape mode's framing of whole and chunked responses."""

    def whole(self, ctx: ServerResponse, status: int, headers: Headers, body: bytes) -> Response:
        """A whole response to an unchunked request, zero-padded (RFC 9292 §3.8), encapsulated."""
        inner = bhttp.encode_response(bhttp.Response(status, headers, body))
        inner += bytes(self.whole_padding(len(inner)))
        return Response(ctx.encapsulate(inner), media_type=OHTTP_RES)

    @abstractmethod
    def whole_padding(self, length: int) -> int:
        """Zero bytes to add to a whole response's binary HTTP message of `length` bytes."""

    @abstractmethod
    async def stream(self, ctx: ChunkedServerResponse, inner: asyncio.Future[Inner], req: Arrival) -> StreamingResponse:
        """A chunked response carrying `inner` (a task started when the request arrived: what is sent
        before it resolves is the framer's choice), each chunk sealed."""
