"""The node's work on one request: decapsulate, run the OpenAI call, encapsulate.

A request's decrypted bytes live only in bytearrays this module owns (the binary HTTP message and
its JSON content), zeroed when the request ends, however it ends. Errors that happen inside the
encryption (bad JSON, bad parameters, capacity) go back encrypted, as the inner HTTP response.

Shape (privacy/shape.py, on by default): a whole response is padded to its size bucket; a chunked
one leaves on a timer that starts when the request arrives, one STREAM_CHUNK-byte chunk per tick,
the first once the response head is known, token or not until the end.
"""
from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncGenerator, Callable

from starlette.responses import Response, StreamingResponse

from traceless.events import emit
from traceless.http.body import parse_json
from traceless.http.errors import ApiError, internal_error
from traceless.node.identity import NodeIdentity
from traceless.node.keyring import ReplayCacheFullError, ReplayedRequestError
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.bhttp.stream import ResponseStreamEncoder
from traceless.privacy.ohttp.chunked import ChunkedServerResponse
from traceless.privacy.ohttp.errors import OHTTP_ERRORS
from traceless.privacy.ohttp.gateway import ServerResponse
from traceless.privacy.ohttp.media import OHTTP_CHUNKED_RES, OHTTP_RES
from traceless.privacy.shape import (
    STREAM_CHUNK,
    ShapePolicy,
    bucket_for,
    bucket_padding,
    content_room,
    json_filler,
    pack,
    sse_filler,
)
from traceless.privacy.wire import encode_varint
from traceless.server.openai_api import OpenAIService
from traceless.server.stream_shape import padding_event
from traceless.server.telemetry import Telemetry

# inner path -> (route name, method): the OpenAI calls, vLLM's tokenizer calls, and the model list
ROUTES = {b"/v1/chat/completions": ("chat_completions", b"POST"), b"/v1/completions": ("completions", b"POST"),
          b"/tokenize": ("tokenize", b"POST"), b"/detokenize": ("detokenize", b"POST"),
          b"/v1/models": ("models", b"GET"), b"/tokenizer_info": ("tokenizer_info", b"GET")}
METERED = ("completions", "chat_completions")
JSON_HEADERS = ((b"content-type", b"application/json"),)
END_LEN = 2  # content terminator + empty trailer section
SSE_HEADERS = ((b"content-type", b"text/event-stream"),)


def _wipe(*buffers: bytearray | None) -> None:
    for b in buffers:
        if b is not None:
            b[:] = bytes(len(b))
            b.clear()


def _inner_error(exc: ApiError) -> tuple[int, bytes]:
    return exc.status, json.dumps(exc.body()).encode()


class NodeService:
    """Decapsulate, run the OpenAI call, encapsulate."""

    def __init__(self, identity: NodeIdentity, api: OpenAIService, telemetry: Telemetry,
                 shape: ShapePolicy = ShapePolicy(), request_events: bool = False):
        self.identity, self.api, self.telemetry, self.shape = identity, api, telemetry, shape
        self.request_events = request_events  # an inner error's line only with --request-events
        self.padding = api.shape.padding

    async def handle(self, body: bytes, chunked: bool) -> Response:
        arrived = asyncio.get_running_loop().time()  # the stream's timer starts here, not at the first token
        buf, ctx = self._open(body, chunked)
        try:
            status, result = await self._run_inner(buf, chunked)
        finally:
            _wipe(buf)
        if isinstance(result, (bytes, bytearray)):
            if isinstance(ctx, ChunkedServerResponse):  # a chunked request always gets a chunked response
                return self._chunked(ctx, status, JSON_HEADERS, _once(bytes(result)), arrived, json_filler)
            inner = bhttp.encode_response(bhttp.Response(status, JSON_HEADERS, bytes(result)))
            if self.shape.on:  # whole responses too: their length would tell the output's length
                inner += bytes(bucket_padding(len(inner)))  # RFC 9292 §3.8 zero padding
            elif self.padding:  # whole responses too: their length would tell the output's length
                inner = bhttp.encode_response(bhttp.Response(status, JSON_HEADERS, bytes(result)),
                                              padding=-len(inner) % self.padding)
            return Response(ctx.encapsulate(inner), media_type=OHTTP_RES)
        if not isinstance(ctx, ChunkedServerResponse):  # _run_inner refuses to stream an unchunked request
            raise RuntimeError("a streamed response for a request that is not chunked")
        return self._chunked(ctx, 200, SSE_HEADERS, result, arrived, sse_filler)

    def _open(self, body: bytes, chunked: bool) -> tuple[bytearray, ServerResponse | ChunkedServerResponse]:
        """Decapsulate under the live key the request names, then admit it to the replay cache (after
        authentication, so garbage cannot fill it). A replay is refused before anything runs."""
        keys = self.identity.keys
        ohttp = keys.server_for(body)
        ctx: ServerResponse | ChunkedServerResponse
        try:
            if ohttp is None:
                raise KeyError("no live key")
            if chunked:
                buf, ctx = ohttp.decapsulate_chunked_request_buffer(body)
            else:
                buf, ctx = ohttp.decapsulate_request_buffer(body)
        except (KeyError, *OHTTP_ERRORS):
            raise ApiError(400, "the request could not be decapsulated", code="decapsulation_failed") from None
        try:
            keys.admit(body)
        except ReplayedRequestError:
            _wipe(buf)
            emit("node.replay_refused", replay_entries=keys.replay_entries())
            raise ApiError(409, "this encapsulated request was already received; it is not run again",
                           type="invalid_request_error", code="request_replayed") from None
        except ReplayCacheFullError:
            _wipe(buf)
            raise ApiError(503, "the node cannot take new requests now; retry later", type="server_error",
                           code="replay_cache_full", headers={"Retry-After": "1"}) from None
        return buf, ctx

    async def _run_inner(self, buf: bytearray, chunked: bool):
        """(status, JSON bytes) or (200, async iterator of SSE events)."""
        content, route, metered = None, None, None
        try:
            try:
                head, content = bhttp.decode_request_buffer(buf)
            except OHTTP_ERRORS:
                raise ApiError(400, "the inner request is not valid binary HTTP", code="invalid_bhttp") from None
            found = ROUTES.get(head.path)
            if found is None:
                raise ApiError(404, "no such route", code="not_found")
            route, method = found
            metered = route if route in METERED else None  # the telemetry counts generation calls only
            if head.method != method:
                raise ApiError(405, "method not allowed", code="method_not_allowed")
            if method == b"GET":
                _wipe(content)
                result = self.api.models() if route == "models" else self.api.tokenizer_info()
            else:
                result = await self._post(route, content, chunked)
            if metered is not None:
                self.telemetry.request(metered, "ok")
            if isinstance(result, dict):
                return 200, json.dumps(result, ensure_ascii=False).encode()
            return 200, result
        except ApiError as exc:
            if self.request_events:
                emit("http.error", component="node", status_code=exc.status, error_kind=exc.kind)
            if metered is not None:
                self.telemetry.request(metered, "rejected" if exc.status < 500 else "error")
            return _inner_error(exc)
        except Exception:
            if self.request_events:
                emit("http.error", component="node", status_code=500, error_kind="internal")
            if metered is not None:
                self.telemetry.request(metered, "error")
            return _inner_error(internal_error())
        finally:
            _wipe(content)

    async def _post(self, route: str, content: bytearray, chunked: bool):
        try:
            parsed = parse_json(content)
        finally:
            _wipe(content)
        if isinstance(parsed, dict) and parsed.get("stream") is True and not chunked:
            raise ApiError(400, "streaming needs a chunked OHTTP request (message/ohttp-chunked-req)",
                           param="stream")
        handler = {"chat_completions": self.api.chat, "completions": self.api.completions,
                   "tokenize": self.api.tokenize, "detokenize": self.api.detokenize}[route]
        return await handler(parsed)

    def _chunked(self, ctx: ChunkedServerResponse, status: int, headers, events: AsyncGenerator[bytes, None],
                 arrived: float, filler: Callable[[int], bytes]) -> StreamingResponse:
        if self.shape.on:
            paced = self._paced if self.shape.tick_ms else self._bucketed
            return StreamingResponse(paced(ctx, status, headers, events, arrived, filler), media_type=OHTTP_CHUNKED_RES)
        padding = self.padding

        async def gen():
            enc, msg = ctx.encryptor(), ResponseStreamEncoder()
            # With padding, every chunk's plaintext is `size` bytes: data chunks carry one padded SSE
            # event; the head and the final chunk are filled out with an SSE comment.
            size = len(encode_varint(padding)) + padding if padding else 0
            try:
                yield enc.seal_chunk(_fill(msg.head(status, headers), size, msg))
                async for event in events:
                    yield enc.seal_chunk(msg.chunk(event))
                filler = _fill(b"", size - END_LEN, msg) if size else b""  # before end(): chunks precede it
                yield enc.seal_final(filler + msg.end())
            finally:
                await events.aclose()

        return StreamingResponse(gen(), media_type=OHTTP_CHUNKED_RES)

    async def _paced(self, ctx: ChunkedServerResponse, status: int, headers, events: AsyncGenerator[bytes, None],
                     arrived: float, filler: Callable[[int], bytes]) -> AsyncGenerator[bytes, None]:
        """One STREAM_CHUNK-byte chunk per tick: what arrived since the last tick, filled out."""
        loop, tick = asyncio.get_running_loop(), self.shape.tick_ms / 1000
        enc, msg = ctx.encryptor(), ResponseStreamEncoder()
        pending = bytearray()

        async def pump() -> None:
            async for event in events:
                pending.extend(event)

        task = asyncio.create_task(pump())
        try:
            # the first tick after the head is known, counted from the request's arrival
            due = arrived + tick * max(1, math.ceil((loop.time() - arrived) / tick))
            await asyncio.sleep(due - loop.time())
            head = msg.head(status, headers)
            chunk, took = pack(pending, STREAM_CHUNK - len(head), filler)
            del pending[:took]
            yield enc.seal_chunk(head + chunk)
            last = content_room(STREAM_CHUNK - END_LEN)
            while True:
                due += tick
                await asyncio.sleep(due - loop.time())
                if task.done() and task.exception() is not None:
                    raise RuntimeError("the response stream failed")  # the client sees a truncated stream
                if task.done() and len(pending) <= last:
                    chunk, _ = pack(pending, STREAM_CHUNK - END_LEN, filler)
                    yield enc.seal_final(chunk + msg.end())
                    return
                chunk, took = pack(pending, STREAM_CHUNK, filler)
                del pending[:took]
                yield enc.seal_chunk(chunk)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await events.aclose()
            pending[:] = bytes(len(pending))

    async def _bucketed(self, ctx: ChunkedServerResponse, status: int, headers, events: AsyncGenerator[bytes, None],
                        arrived: float, filler: Callable[[int], bytes]) -> AsyncGenerator[bytes, None]:
        """No timer (tick 0): one chunk per event as it comes, each padded to its size bucket."""
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


def _fill(prefix: bytes, size: int, msg: ResponseStreamEncoder) -> bytes:
    """prefix + one content chunk holding an SSE comment, `size` bytes in all (prefix alone if
    size is 0 or too small to hold a comment)."""
    for varint_len in (1, 2, 4):
        room = size - len(prefix) - varint_len
        if room >= 4 and len(encode_varint(room)) == varint_len:
            return prefix + msg.chunk(padding_event(room))
    return prefix


async def _once(data: bytes) -> AsyncGenerator[bytes, None]:
    yield data
