"""The plaintext OpenAI-compatible HTTP server (Starlette), for local use and as the
privacy-off baseline. Routes: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics.

Bodies are read through a size cap (413 beyond it). A client that disconnects aborts its
request: streaming responses are cancelled by Starlette; non-streaming handlers race the
generation against the connection and abort when the connection closes first.
"""
from __future__ import annotations

import asyncio
import json
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
from traceless.server.async_engine import AsyncEngine
from traceless.server.errors import ApiError, internal_error
from traceless.server.http_common import engine_routes, read_capped, route_error
from traceless.server.metrics import Metrics
from traceless.server.openai_api import OpenAIService
from traceless.server.stream_shape import StreamShape

DEFAULT_MAX_BODY_BYTES = 4 * 2**20


@dataclass(frozen=True, slots=True)
class ServerSettings:
    model_name: str
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    component: str = "server"
    stream_shape: StreamShape = StreamShape()


async def read_json_body(request: Request, limit: int):
    raw = await read_capped(request, limit)
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None


async def _until_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(engine: AsyncEngine, settings: ServerSettings, metrics: Metrics | None = None) -> Starlette:
    metrics = metrics or Metrics()
    service = OpenAIService(engine, settings.model_name, metrics, settings.stream_shape)

    async def generation(request: Request, handler, endpoint: str) -> Response:
        t0 = time.monotonic()
        stream, status = False, 500
        try:
            body = await read_json_body(request, settings.max_body_bytes)
            stream = isinstance(body, dict) and body.get("stream") is True
            work = asyncio.ensure_future(handler(body))
            watcher = asyncio.ensure_future(_until_disconnect(request))
            done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            watcher.cancel()
            if work not in done:  # the client left: cancelling aborts every engine request
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                status = 499
                metrics.inc("traceless_requests_total", endpoint=endpoint, status="aborted")
                return Response(status_code=499)
            result = work.result()
            status = 200
            metrics.inc("traceless_requests_total", endpoint=endpoint, status="ok")
            if isinstance(result, dict):
                metrics.observe("traceless_e2e_request_latency_seconds", time.monotonic() - t0)
                return JSONResponse(result)
            return StreamingResponse(_timed(result, metrics, t0), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        except ApiError as exc:
            status = exc.status
            metrics.inc("traceless_requests_total", endpoint=endpoint, status="rejected" if exc.status < 500 else "error")
            emit("http.error", component=settings.component, status_code=exc.status, error_kind=exc.kind)
            return exc.response()
        except Exception:
            metrics.inc("traceless_requests_total", endpoint=endpoint, status="error")
            emit("http.error", component=settings.component, status_code=500, error_kind="internal")
            return internal_error().response()
        finally:
            emit("http.request", component=settings.component, route=endpoint, status_code=status,
                 duration_s=time.monotonic() - t0, stream=stream)

    async def completions(request: Request) -> Response:
        return await generation(request, service.completions, "completions")

    async def chat(request: Request) -> Response:
        return await generation(request, service.chat, "chat_completions")

    async def models(request: Request) -> Response:
        return JSONResponse(service.models())

    @asynccontextmanager
    async def lifespan(app):
        engine.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, engine.stop)

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        *engine_routes(engine, metrics),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: route_error})


async def _timed(body: AsyncIterator[bytes], metrics: Metrics, t0: float) -> AsyncIterator[bytes]:
    try:
        async for chunk in body:
            yield chunk
    finally:
        await body.aclose()
        metrics.observe("traceless_e2e_request_latency_seconds", time.monotonic() - t0)
