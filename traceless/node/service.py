"""The node's work on one request: decapsulate, run the OpenAI call, encapsulate.

A request's decrypted bytes live only in bytearrays this module owns (the binary HTTP message and
its JSON content), zeroed when the request ends, however it ends. Errors that happen inside the
encryption (bad JSON, bad parameters, capacity) go back encrypted, as the inner HTTP response.

Shape (privacy/shape.py, on by default): a whole response is padded to its size bucket; a chunked
one leaves on a timer that starts when the request arrives (node/paced.py): the outer HTTP head and
the first chunk on the first tick past the request's prefill budget (never at the first token),
one STREAM_CHUNK-byte chunk per tick, token or not, to a power-of-two number of ticks.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from starlette.responses import Response, StreamingResponse

from traceless.events import emit
from traceless.http.body import parse_json
from traceless.http.errors import ApiError, internal_error
from traceless.node.identity import NodeIdentity
from traceless.node.keyring import ReplayCacheFullError, ReplayedRequestError
from traceless.node.paced import END_LEN, Pace, bucketed, paced
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.bhttp.stream import ResponseStreamEncoder
from traceless.privacy.ohttp.chunked import ChunkedServerResponse
from traceless.privacy.ohttp.errors import OHTTP_ERRORS
from traceless.privacy.ohttp.gateway import ServerResponse
from traceless.privacy.ohttp.media import OHTTP_CHUNKED_RES, OHTTP_RES
from traceless.privacy.shape import ShapePolicy, bucket_padding, first_tick, json_filler, sse_filler
from traceless.privacy.wire import encode_varint
from traceless.server.openai_api import OpenAIService
from traceless.server.stream_shape import padding_event
from traceless.server.telemetry import Telemetry

# inner path -> (route name, method): the OpenAI calls, vLLM's tokenizer calls, and the model list
ROUTES = {b"/v1/chat/completions": ("chat_completions", b"POST"), b"/v1/completions": ("completions", b"POST"),
          b"/tokenize": ("tokenize", b"POST"), b"/detokenize": ("detokenize", b"POST"),
          b"/v1/models": ("models", b"GET"), b"/tokenizer_info": ("tokenizer_info", b"GET")}
METERED = ("completions", "chat_completions")
# A shaped stream holds the engine's idle work off for this many ticks past each tick it sends: a
# late tick (a loaded machine) does not let it in mid-stream; a stream that ends lets it in soon.
IDLE_HOLD_TICKS = 3
JSON_HEADERS = ((b"content-type", b"application/json"),)
SSE_HEADERS = ((b"content-type", b"text/event-stream"),)


def _wipe(*buffers: bytearray | None) -> None:
    for b in buffers:
        if b is not None:
            b[:] = bytes(len(b))
            b.clear()


@dataclass(slots=True)
class _Arrival:
    """What a shaped stream's timing is set from: when the request arrived, its padded length, and
    how many token events its longest answer has (max_tokens x n)."""

    arrived: float
    request_bytes: int
    max_tokens: int | None = None


def _max_tokens(parsed: object) -> int | None:
    if not isinstance(parsed, dict):
        return None
    limit, n = parsed.get("max_completion_tokens", parsed.get("max_tokens")), parsed.get("n", 1)
    ok = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (limit, n))
    return limit * n if ok else None


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
        req = _Arrival(arrived, len(buf))  # the inner request's length with the client's padding: its bucket
        try:
            status, result = await self._run_inner(buf, chunked, req)
        finally:
            _wipe(buf)
        if isinstance(result, (bytes, bytearray)):
            if isinstance(ctx, ChunkedServerResponse):  # a chunked request always gets a chunked response
                return await self._chunked(ctx, status, JSON_HEADERS, _once(bytes(result)), req, json_filler)
            inner = bhttp.encode_response(bhttp.Response(status, JSON_HEADERS, bytes(result)))
            if self.shape.on:  # whole responses too: their length would tell the output's length
                inner += bytes(bucket_padding(len(inner)))  # RFC 9292 §3.8 zero padding
            elif self.padding:  # whole responses too: their length would tell the output's length
                inner = bhttp.encode_response(bhttp.Response(status, JSON_HEADERS, bytes(result)),
                                              padding=-len(inner) % self.padding)
            return Response(ctx.encapsulate(inner), media_type=OHTTP_RES)
        if not isinstance(ctx, ChunkedServerResponse):  # _run_inner refuses to stream an unchunked request
            raise RuntimeError("a streamed response for a request that is not chunked")
        return await self._chunked(ctx, 200, SSE_HEADERS, result, req, sse_filler)

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

    # Above the complexity limit on purpose: one try over the request's whole life, each except one
    # way it can end, each leaving nothing behind (threat T2); split, that would be spread out.
    async def _run_inner(self, buf: bytearray, chunked: bool, req: _Arrival):  # noqa: C901
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
                result = await self._post(route, content, chunked, req)
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

    async def _post(self, route: str, content: bytearray, chunked: bool, req: _Arrival):
        try:
            parsed = parse_json(content)
        finally:
            _wipe(content)
        req.max_tokens = _max_tokens(parsed)
        if isinstance(parsed, dict) and parsed.get("stream") is True and not chunked:
            raise ApiError(400, "streaming needs a chunked OHTTP request (message/ohttp-chunked-req)",
                           param="stream")
        handler = {"chat_completions": self.api.chat, "completions": self.api.completions,
                   "tokenize": self.api.tokenize, "detokenize": self.api.detokenize}[route]
        return await handler(parsed)

    async def _chunked(self, ctx: ChunkedServerResponse, status: int, headers, events: AsyncGenerator[bytes, None],
                       req: _Arrival, filler: Callable[[int], bytes]) -> StreamingResponse:
        if self.shape.on and self.shape.tick_ms:
            pace = self._pace(req, filler is sse_filler)
            wait = pace.first_due - asyncio.get_running_loop().time()
            # the engine's idle work waits for the stream's end (AsyncEngine.defer_idle): from now to
            # the first tick, then a few ticks past each tick
            self.api.engine.defer_idle(max(0.0, wait) + IDLE_HOLD_TICKS * pace.tick_s)
            try:  # the response head leaves on the first tick, not when the first token is known
                await asyncio.sleep(wait)
            except BaseException:
                await events.aclose()  # the client left: the engine request is aborted
                raise
            body = paced(ctx, status, headers, events, pace, filler)
            return StreamingResponse(self._holding_idle(body, pace.tick_s), media_type=OHTTP_CHUNKED_RES)
        if self.shape.on:
            return StreamingResponse(bucketed(ctx, status, headers, events, filler), media_type=OHTTP_CHUNKED_RES)
        return self._unshaped(ctx, status, headers, events)

    async def _holding_idle(self, body: AsyncGenerator[bytes, None], tick_s: float) -> AsyncGenerator[bytes, None]:
        """The paced stream, holding the engine's idle work off at every tick."""
        try:
            async for chunk in body:
                self.api.engine.defer_idle(IDLE_HOLD_TICKS * tick_s)
                yield chunk
        finally:
            await body.aclose()

    def _pace(self, req: _Arrival, sse: bool) -> Pace:
        tick = self.shape.tick_ms / 1000
        # no prompt longer than the context needs a longer prefill budget (8 bytes a token: token-id lists)
        budget = self.shape.prefill_budget_s(req.request_bytes, 8 * self.api.max_model_len)
        due = first_tick(req.arrived, asyncio.get_running_loop().time(), tick, budget)
        # a JSON body comes whole at the end (its time shows anyway): powers of two only
        return Pace(due, tick, self.shape.decode_budget_ticks(req.max_tokens) if sse else None)

    def _unshaped(self, ctx: ChunkedServerResponse, status: int, headers,
                  events: AsyncGenerator[bytes, None]) -> StreamingResponse:
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
