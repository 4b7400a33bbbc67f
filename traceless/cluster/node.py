"""The private node: the engine behind Oblivious HTTP, with attestation (docs/private-path.md).

Routes: GET /pcc/v1/attestation, GET /pcc/v1/ohttp-keys, POST /pcc/v1/ohttp, GET /health,
GET /metrics. Nothing else: no plaintext API, no debug or admin route (DESIGN invariant 8).

A request's decrypted bytes live only in bytearrays this module owns (the binary HTTP message and
its JSON content), zeroed when the request ends, however it ends. Errors that happen inside the
encryption (bad JSON, bad parameters, capacity) go back encrypted, as the inner HTTP response.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from traceless.events import emit
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.attestation.software import Attester, new_claims
from traceless.privacy.bhttp.stream import ResponseStreamEncoder
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless.privacy.ohttp.errors import OHTTP_ERRORS
from traceless.server.async_engine import AsyncEngine
from traceless.server.errors import ApiError, internal_error
from traceless.server.http_common import engine_routes, read_capped, route_error
from traceless.server.metrics import Metrics
from traceless.server.openai_api import OpenAIService
from traceless.server.stream_shape import StreamShape, padding_event
from traceless.privacy.wire import encode_varint

OHTTP_REQ, OHTTP_RES = "message/ohttp-req", "message/ohttp-res"
OHTTP_CHUNKED_REQ, OHTTP_CHUNKED_RES = "message/ohttp-chunked-req", "message/ohttp-chunked-res"
ROUTES = {b"/v1/chat/completions": "chat_completions", b"/v1/completions": "completions"}
JSON_HEADERS = ((b"content-type", b"application/json"),)
END_LEN = 2  # content terminator + empty trailer section
SSE_HEADERS = ((b"content-type", b"text/event-stream"),)


@dataclass(frozen=True, slots=True)
class NodeSettings:
    model_name: str
    capacity: int = 1
    max_body_bytes: int = 4 * 2**20
    attestation_ttl_s: int = 300
    gateway_url: str | None = None
    public_url: str | None = None
    register_interval_s: float = 60.0
    stream_shape: StreamShape = StreamShape()


class NodeIdentity:
    """What the node proves and the keys it proves it with. The OHTTP key pair is generated here,
    in memory, and never leaves the process: a restart is a cryptographic erase."""

    def __init__(self, attester: Attester, measurement: Measurement):
        self.ohttp = OhttpServer()
        self.attester = attester
        self.measurement = measurement
        self.ohttp_keys = self.ohttp.ohttp_keys()

    def attestation(self, nonce: bytes | None, ttl_s: int) -> str:
        claims = new_claims(self.measurement, self.ohttp.key_config.encode(), nonce or os.urandom(16),
                            int(time.time()), self.attester.attester_type, ttl_s)
        return self.attester.attest(claims)


def _wipe(*buffers: bytearray | None) -> None:
    for b in buffers:
        if b is not None:
            b[:] = bytes(len(b))
            b.clear()


def _inner_error(exc: ApiError) -> tuple[int, bytes]:
    return exc.status, json.dumps(exc.body()).encode()


class NodeService:
    """Decapsulate, run the OpenAI call, encapsulate."""

    def __init__(self, identity: NodeIdentity, api: OpenAIService, metrics: Metrics):
        self.identity, self.api, self.metrics = identity, api, metrics
        self.padding = api.shape.padding

    async def handle(self, body: bytes, chunked: bool) -> Response:
        ohttp = self.identity.ohttp
        try:
            if chunked:
                buf, ctx = ohttp.decapsulate_chunked_request_buffer(body)
            else:
                buf, ctx = ohttp.decapsulate_request_buffer(body)
        except OHTTP_ERRORS:
            raise ApiError(400, "the request could not be decapsulated", code="decapsulation_failed") from None
        try:
            status, result = await self._run_inner(buf, chunked)
        finally:
            _wipe(buf)
        if isinstance(result, (bytes, bytearray)):
            if chunked:  # a chunked request always gets a chunked response
                return self._chunked(ctx, status, JSON_HEADERS, _once(bytes(result)))
            inner = bhttp.encode_response(bhttp.Response(status, JSON_HEADERS, bytes(result)))
            if self.padding:  # whole responses too: their length would tell the output's length
                inner = bhttp.encode_response(bhttp.Response(status, JSON_HEADERS, bytes(result)),
                                              padding=-len(inner) % self.padding)
            return Response(ctx.encapsulate(inner), media_type=OHTTP_RES)
        return self._chunked(ctx, 200, SSE_HEADERS, result)

    async def _run_inner(self, buf: bytearray, chunked: bool):
        """(status, JSON bytes) or (200, async iterator of SSE events)."""
        content = None
        try:
            try:
                head, content = bhttp.decode_request_buffer(buf)
            except OHTTP_ERRORS:
                raise ApiError(400, "the inner request is not valid binary HTTP", code="invalid_bhttp") from None
            route = ROUTES.get(head.path)
            if route is None:
                raise ApiError(404, "no such route", code="not_found")
            if head.method != b"POST":
                raise ApiError(405, "method not allowed", code="method_not_allowed")
            try:
                parsed = json.loads(content)
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
            finally:
                _wipe(content)
            if isinstance(parsed, dict) and parsed.get("stream") is True and not chunked:
                raise ApiError(400, "streaming needs a chunked OHTTP request (message/ohttp-chunked-req)",
                               param="stream")
            handler = self.api.chat if route == "chat_completions" else self.api.completions
            result = await handler(parsed)
            self.metrics.inc("traceless_requests_total", endpoint=route, status="ok")
            if isinstance(result, dict):
                return 200, json.dumps(result, ensure_ascii=False).encode()
            return 200, result
        except ApiError as exc:
            emit("http.error", component="node", status_code=exc.status, error_kind=exc.kind)
            return _inner_error(exc)
        except Exception:
            emit("http.error", component="node", status_code=500, error_kind="internal")
            return _inner_error(internal_error())
        finally:
            _wipe(content)

    def _chunked(self, ctx, status: int, headers, events: AsyncIterator[bytes]) -> StreamingResponse:
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


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def create_node_app(engine: AsyncEngine, identity: NodeIdentity, settings: NodeSettings,
                    metrics: Metrics | None = None) -> Starlette:
    metrics = metrics or Metrics()
    service = NodeService(identity, OpenAIService(engine, settings.model_name, metrics, settings.stream_shape), metrics)

    async def attestation(request: Request) -> Response:
        raw = request.query_params.get("nonce")
        try:
            nonce = bytes.fromhex(raw) if raw is not None else None
            if nonce is not None and not 8 <= len(nonce) <= 64:
                raise ValueError
        except ValueError:
            return ApiError(400, "nonce must be 8 to 64 bytes in hex", param="nonce").response()
        return JSONResponse({"attestation": identity.attestation(nonce, settings.attestation_ttl_s),
                             "ohttp_keys": base64.b64encode(identity.ohttp_keys).decode()})

    async def ohttp_keys(request: Request) -> Response:
        return Response(identity.ohttp_keys, media_type="application/ohttp-keys")

    async def ohttp(request: Request) -> Response:
        t0, status = time.monotonic(), 500
        try:
            kind = request.headers.get("content-type", "").split(";")[0].strip()
            if kind not in (OHTTP_REQ, OHTTP_CHUNKED_REQ):
                raise ApiError(415, f"content-type must be {OHTTP_REQ} or {OHTTP_CHUNKED_REQ}", code="unsupported_media_type")
            body = await read_capped(request, settings.max_body_bytes)
            response = await service.handle(body, chunked=kind == OHTTP_CHUNKED_REQ)
            status = response.status_code
            return response
        except ApiError as exc:
            status = exc.status
            emit("http.error", component="node", status_code=exc.status, error_kind="decrypt_failed" if exc.status == 400 else exc.kind)
            return exc.response()
        finally:
            emit("http.request", component="node", route="ohttp", status_code=status,
                 duration_s=time.monotonic() - t0, stream=False)

    @asynccontextmanager
    async def lifespan(app):
        engine.start(asyncio.get_running_loop())
        task = asyncio.create_task(_register_loop(identity, settings)) if settings.gateway_url else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            await asyncio.get_running_loop().run_in_executor(None, engine.stop)

    routes = [
        Route("/pcc/v1/attestation", attestation, methods=["GET"]),
        Route("/pcc/v1/ohttp-keys", ohttp_keys, methods=["GET"]),
        Route("/pcc/v1/ohttp", ohttp, methods=["POST"]),
        *engine_routes(engine, metrics),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: route_error})


async def _register_loop(identity: NodeIdentity, settings: NodeSettings) -> None:
    """Register with the gateway now and then again every interval (fresh attestation each time)."""
    import httpx

    async with httpx.AsyncClient(timeout=10) as client:
        while True:
            body = {"url": settings.public_url, "model": settings.model_name, "capacity": settings.capacity,
                    "attestation": identity.attestation(None, settings.attestation_ttl_s),
                    "ohttp_keys": base64.b64encode(identity.ohttp_keys).decode()}
            try:
                r = await client.post(settings.gateway_url.rstrip("/") + "/pcc/v1/register", json=body)
                emit("node.registered", ok=r.status_code == 200, status_code=r.status_code)
            except httpx.HTTPError:
                emit("node.registered", ok=False, status_code=0)
            await asyncio.sleep(settings.register_interval_s)
