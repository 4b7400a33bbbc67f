"""GET /health and GET /metrics for an app that serves an engine (plaintext server, node)."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from traceless.server.async_engine import AsyncEngine
from traceless.server.metrics import Metrics, set_engine_gauges


def engine_routes(engine: AsyncEngine, metrics: Metrics) -> list[Route]:
    async def health(request: Request) -> Response:
        if engine.dead:
            return JSONResponse({"status": "dead"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics_route(request: Request) -> Response:
        set_engine_gauges(metrics, engine)
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    return [Route("/health", health, methods=["GET"]), Route("/metrics", metrics_route, methods=["GET"])]
