"""The operator's listener: GET /metrics, and nothing else.

It is served on its own host and port (`--metrics-host/--metrics-port`, loopback by default),
never on the public port that clients, the relay or the gateway reach; what it serves is the
windowed telemetry of server/telemetry.py (docs/telemetry.md says what an operator can learn)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from traceless.http.app import create_app, endpoint
from traceless.server.telemetry import Telemetry


def create_operator_app(telemetry: Telemetry, component: str) -> Starlette:
    async def metrics(request: Request) -> Response:
        return PlainTextResponse(telemetry.render(), media_type="text/plain; version=0.0.4")

    return create_app(component, [Route("/metrics", endpoint(component, "metrics", metrics), methods=["GET"])])
