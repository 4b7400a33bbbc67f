"""HTTP pieces every engine-serving app shares (plaintext server, private node, local proxy)."""
from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from traceless.server.errors import ApiError
from traceless.server.metrics import Metrics, set_engine_gauges


async def read_capped(request: Request, limit: int) -> bytes:
    """The request body, or 413 as soon as it passes `limit` bytes (a declared length over the
    limit is refused before anything is read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body exceeds {limit} bytes", code="body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body exceeds {limit} bytes", code="body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def route_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's 404/405 for unknown routes and methods, in OpenAI's JSON error shape."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return ApiError(exc.status_code, "no such route" if exc.status_code == 404 else "method not allowed",
                    code=code).response()


def engine_routes(engine, metrics: Metrics) -> list[Route]:
    """GET /health and GET /metrics (allowlisted) for an AsyncEngine."""

    async def health(request: Request) -> Response:
        if engine.dead:
            return JSONResponse({"status": "dead"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics_route(request: Request) -> Response:
        set_engine_gauges(metrics, engine)
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    return [Route("/health", health, methods=["GET"]), Route("/metrics", metrics_route, methods=["GET"])]
