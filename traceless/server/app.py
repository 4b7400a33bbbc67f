"""The plaintext OpenAI-compatible HTTP server (Starlette), for local use and as the
privacy-off baseline. Routes: /v1/models, /v1/completions, /v1/chat/completions, /tokenize,
/detokenize, /tokenizer_info (vLLM's), /health; /v1/embeddings and /v1/responses answer 501.
Metrics are served only by the operator's listener (operator_app.py), from the same Telemetry.
An API key and the browser origins allowed are checked in front of every route (access.py).

Bodies are read through a size cap (413 beyond it). A client that disconnects aborts its
request: streaming responses are cancelled by Starlette; non-streaming handlers race the
generation against the connection and abort when the connection closes first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from traceless.http.app import create_app as create_http_app
from traceless.http.app import endpoint
from traceless.http.body import read_json
from traceless.http.disconnect import race_disconnect
from traceless.http.errors import ApiError
from traceless.http.openai_routes import OPENAI_ROUTES, OpenAIRoute, RouteKind
from traceless.server.access import AccessPolicy, protect
from traceless.server.async_engine import AsyncEngine
from traceless.server.engine_routes import engine_routes
from traceless.server.openai_api import OpenAIService
from traceless.server.stream_shape import StreamShape
from traceless.server.telemetry import Telemetry

DEFAULT_MAX_BODY_BYTES = 4 * 2**20
UNSUPPORTED_ROUTES = ("/v1/embeddings", "/v1/responses")  # OpenAI's, not implemented here
Work = Callable[[object], Awaitable[dict | AsyncGenerator[bytes, None]]]


@dataclass(frozen=True, slots=True)
class ServerSettings:
    model_name: str
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    component: str = "server"
    stream_shape: StreamShape = StreamShape()
    api_key: str | None = None  # required as a bearer token on every route but /health
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed (CORS); others get 403


def create_app(engine: AsyncEngine, settings: ServerSettings, telemetry: Telemetry | None = None):
    telemetry = telemetry or Telemetry(engine=engine)
    service = OpenAIService(engine, settings.model_name, telemetry, settings.stream_shape)

    def info(work: Callable[[], dict]):
        async def handle(request: Request) -> Response:
            return JSONResponse(work())

        return handle

    def tokens(work: Callable[[object], Awaitable[dict]]):
        async def handle(request: Request) -> Response:
            return JSONResponse(await work(await read_json(request, settings.max_body_bytes)))

        return handle

    def route(r: OpenAIRoute) -> Route:
        work = service.handlers()[r.name]
        if r.kind is RouteKind.GENERATION:
            return Route(r.path, _generation(work, r.name, settings, telemetry), methods=[r.method])
        handle = info(work) if r.kind is RouteKind.INFO else tokens(work)
        return Route(r.path, endpoint(settings.component, r.name, handle), methods=[r.method])

    @asynccontextmanager
    async def lifespan(app):
        engine.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, engine.stop)
            service.close()

    routes = [
        *(route(r) for r in OPENAI_ROUTES),
        *engine_routes(engine),
        *(
            Route(path, endpoint(settings.component, "other", _unsupported(path)), methods=["POST"])
            for path in UNSUPPORTED_ROUTES
        ),
    ]
    app = create_http_app(settings.component, routes, lifespan)
    protect(app, AccessPolicy(settings.api_key, settings.allowed_origins), settings.component)
    return app


def _generation(work: Work, name: str, settings: ServerSettings, telemetry: Telemetry):
    """The handler of a generation route: the body read under its cap, the work raced against the
    client's disconnect (None: the client left), its outcome counted in the telemetry window."""

    async def handle(request: Request) -> Response:
        t0 = time.monotonic()
        try:
            body = await read_json(request, settings.max_body_bytes)
            result = await race_disconnect(request, work(body))
        except ApiError as exc:
            telemetry.request(name, "rejected" if exc.status < 500 else "error")
            raise
        except Exception:
            telemetry.request(name, "error")
            raise
        if result is None:
            telemetry.request(name, "aborted")
            return Response(status_code=499)
        if isinstance(result, dict):
            telemetry.e2e(time.monotonic() - t0)
            telemetry.request(name, "ok")
            return JSONResponse(result)
        return StreamingResponse(
            _timed(result, telemetry, name, t0), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    return endpoint(settings.component, name, handle)


def _unsupported(path: str):
    async def handle(request: Request) -> Response:
        raise ApiError(
            501,
            f"{path} is not supported by this server: it serves /v1/chat/completions and /v1/completions (docs/api.md)",
            code="unsupported_endpoint",
        )

    return handle


async def _timed(
    body: AsyncGenerator[bytes, None], telemetry: Telemetry, name: str, t0: float
) -> AsyncGenerator[bytes, None]:
    """The stream, with the request counted in the telemetry window when it ends."""
    status = "aborted"
    try:
        async for chunk in body:
            yield chunk
        status = "ok"
    finally:
        await body.aclose()
        telemetry.e2e(time.monotonic() - t0)
        telemetry.request(name, status)
