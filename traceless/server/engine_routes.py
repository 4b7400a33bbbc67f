"""GET /health for an app that serves an engine (plaintext server, node). Metrics are not here:
they are served only on the operator's listener (server/operator_app.py)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from traceless.server.async_engine import AsyncEngine


def engine_routes(engine: AsyncEngine) -> list[Route]:
    async def health(request: Request) -> Response:
        if engine.dead:
            return JSONResponse({"status": "dead"}, status_code=503)
        if engine.restarting:  # a failed engine is being replaced: requests wait for the fresh one
            return JSONResponse({"status": "restarting"}, status_code=503)
        return JSONResponse({"status": "ok"})

    return [Route("/health", health, methods=["GET"])]
