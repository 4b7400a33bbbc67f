"""The node's work on one request: decapsulate, run the OpenAI call, encapsulate.

A request's decrypted bytes live only in bytearrays this module owns (the binary HTTP message and
its JSON content), zeroed when the request ends, however it ends. Errors that happen inside the
encryption (bad JSON, bad parameters, capacity) go back encrypted, as the inner HTTP response.

What leaves the node is framed by the node's one Framer (node/framing/: chosen once from the
shape settings): by default a whole response padded to its size bucket and a chunked one on a
timer that starts when the request arrives, beside the inner work (the framer is handed the inner
response as a task, and sends on its grid whether or not that task has finished).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator

from starlette.responses import Response

from traceless.events import emit
from traceless.http.body import parse_json
from traceless.http.errors import ApiError, internal_error
from traceless.http.openai_routes import BY_PATH, OpenAIRoute, RouteKind
from traceless.node.framing import Arrival, Framer, Inner
from traceless.node.identity import NodeIdentity
from traceless.node.keyring import ReplayCacheFullError, ReplayedRequestError
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.ohttp.chunked import ChunkedServerResponse
from traceless.privacy.ohttp.errors import OHTTP_ERRORS
from traceless.privacy.ohttp.gateway import ServerResponse
from traceless.privacy.shape import json_filler, sse_filler
from traceless.server.openai_api import OpenAIService
from traceless.server.telemetry import Telemetry

JSON_HEADERS = ((b"content-type", b"application/json"),)
SSE_HEADERS = ((b"content-type", b"text/event-stream"),)


def _wipe(*buffers: bytearray | None) -> None:
    for b in buffers:
        if b is not None:
            b[:] = bytes(len(b))
            b.clear()


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

    def __init__(
        self,
        identity: NodeIdentity,
        api: OpenAIService,
        telemetry: Telemetry,
        framer: Framer,
        request_events: bool = False,
    ):
        self.identity, self.api, self.telemetry, self.framer = identity, api, telemetry, framer
        self.request_events = request_events  # an inner error's line only with --request-events

    async def handle(self, body: bytes, chunked: bool) -> Response:
        arrived = asyncio.get_running_loop().time()  # the stream's timer starts here, not at the first token
        buf, ctx = self._open(body, chunked)
        req = Arrival(arrived, len(buf))  # the inner request's length with the client's padding: its bucket
        if isinstance(ctx, ChunkedServerResponse):  # a chunked request always gets a chunked response
            # the framer's timer runs from now, beside the inner work (a shaped stream's first chunk
            # does not wait for the first token)
            inner = asyncio.ensure_future(self._inner(buf, req))
            inner.add_done_callback(lambda _: _wipe(buf))  # also when cancelled before it ever ran
            return await self.framer.stream(ctx, inner, req)
        try:
            status, result = await self._run_inner(buf, chunked, req)
        finally:
            _wipe(buf)
        if not isinstance(result, (bytes, bytearray)):  # _run_inner refuses to stream an unchunked request
            raise RuntimeError("a streamed response for a request that is not chunked")
        return self.framer.whole(ctx, status, JSON_HEADERS, bytes(result))

    async def _inner(self, buf: bytearray, req: Arrival) -> Inner:
        """The inner response to a chunked request: SSE events, or one JSON document."""
        try:
            status, result = await self._run_inner(buf, True, req)
        finally:
            _wipe(buf)
        if isinstance(result, (bytes, bytearray)):
            return Inner(status, JSON_HEADERS, _once(bytes(result)), json_filler)
        return Inner(200, SSE_HEADERS, result, sse_filler)

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
            raise ApiError(
                409,
                "this encapsulated request was already received; it is not run again",
                type="invalid_request_error",
                code="request_replayed",
            ) from None
        except ReplayCacheFullError:
            _wipe(buf)
            raise ApiError(
                503,
                "the node cannot take new requests now; retry later",
                type="server_error",
                code="replay_cache_full",
                headers={"Retry-After": "1"},
            ) from None
        return buf, ctx

    async def _run_inner(self, buf: bytearray, chunked: bool, req: Arrival):
        """(status, JSON bytes) or (200, async iterator of SSE events). One try over the request's
        whole life: each except is one way it can end, and each leaves nothing behind (threat T2)."""
        content, metered = None, None
        try:
            try:
                head, content = bhttp.decode_request_buffer(buf)
            except OHTTP_ERRORS:
                raise ApiError(400, "the inner request is not valid binary HTTP", code="invalid_bhttp") from None
            route = BY_PATH.get(head.path.decode("latin-1"))  # every byte maps to one character
            if route is None:
                raise ApiError(404, "no such route", code="not_found")
            # the telemetry counts generation calls only
            metered = route.name if route.kind is RouteKind.GENERATION else None
            if head.method != route.method.encode():
                raise ApiError(405, "method not allowed", code="method_not_allowed")
            result = await self._answer(route, content, chunked, req)
            if metered is not None:
                self.telemetry.request(metered, "ok")
            if isinstance(result, dict):
                return 200, json.dumps(result, ensure_ascii=False).encode()
            return 200, result
        except ApiError as exc:
            return self._ended_in_error(exc, metered)
        except Exception:
            return self._ended_in_error(internal_error(), metered)
        finally:
            _wipe(content)

    async def _answer(self, route: OpenAIRoute, content: bytearray, chunked: bool, req: Arrival):
        """The route's answer: an INFO route reads no body (wiped at once), the others parse theirs."""
        if route.kind is RouteKind.INFO:
            _wipe(content)
            return self.api.handlers()[route.name]()
        return await self._post(route.name, content, chunked, req)

    def _ended_in_error(self, exc: ApiError, metered: str | None) -> tuple[int, bytes]:
        """The inner response of a request that ended in `exc`, counted (a status and a fixed kind)."""
        if self.request_events:
            emit("http.error", component="node", status_code=exc.status, error_kind=exc.kind)
        if metered is not None:
            self.telemetry.request(metered, "rejected" if exc.status < 500 else "error")
        return _inner_error(exc)

    async def _post(self, route: str, content: bytearray, chunked: bool, req: Arrival):
        try:
            parsed = parse_json(content)
        finally:
            _wipe(content)
        req.max_tokens = _max_tokens(parsed)
        if isinstance(parsed, dict) and parsed.get("stream") is True and not chunked:
            raise ApiError(400, "streaming needs a chunked OHTTP request (message/ohttp-chunked-req)", param="stream")
        return await self.api.handlers()[route](parsed)


async def _once(data: bytes) -> AsyncGenerator[bytes, None]:
    yield data
