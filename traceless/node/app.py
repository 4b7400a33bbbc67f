"""The node's HTTP app: GET /pcc/v1/attestation, GET /pcc/v1/ohttp-keys, POST /pcc/v1/ohttp,
GET /health. Nothing else: no plaintext API, no debug or admin route, no metrics (threat T11,
docs/threat-model.md); the windowed metrics are served on the operator's own listener
(server/operator_app.py, from the Telemetry given here)."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from traceless.http.app import create_app, endpoint
from traceless.http.body import read_body, require_media_type
from traceless.http.disconnect import race_disconnect
from traceless.node.attestation_route import attestation_handler
from traceless.node.framing import framer_for
from traceless.node.identity import NodeIdentity
from traceless.node.registration import register_loop
from traceless.node.service import NodeService
from traceless.node.settings import NodeSettings
from traceless.privacy.ohttp.media import OHTTP_CHUNKED_REQ, OHTTP_KEYS, REQUEST_MEDIA_TYPES
from traceless.server.async_engine import AsyncEngine
from traceless.server.ballast_sink import absorb
from traceless.server.engine_routes import engine_routes
from traceless.server.openai_api import OpenAIService
from traceless.server.telemetry import Telemetry

COMPONENT = "node"


def create_node_app(
    engine: AsyncEngine, identity: NodeIdentity, settings: NodeSettings, telemetry: Telemetry | None = None
) -> Starlette:
    telemetry = telemetry or Telemetry(engine=engine)
    api = OpenAIService(engine, settings.model_name, telemetry, settings.stream_shape)
    framer = framer_for(settings.shape, settings.stream_shape.padding, api.max_model_len, api.engine.defer_idle)
    # the engine's load does not end with an answer while its stream is open (server/ballast.py)
    ballast = settings.shape.paced and settings.shape.ballast
    api.engine.keep_busy_while_held(ballast)
    service = NodeService(identity, api, telemetry, framer, settings.request_events)

    async def ohttp_keys(request: Request) -> Response:
        return Response(identity.ohttp_keys(), media_type=OHTTP_KEYS)

    async def ohttp(request: Request) -> Response:
        kind = require_media_type(request, REQUEST_MEDIA_TYPES)
        body = await read_body(request, settings.max_body_bytes)
        # A client that leaves before a whole (non-streamed) response is ready cancels the work:
        # its engine requests are aborted and their blocks zeroed. Streams stop with their body.
        response = await race_disconnect(request, service.handle(body, chunked=kind == OHTTP_CHUNKED_REQ))
        return response if response is not None else Response(status_code=499)

    @asynccontextmanager
    async def lifespan(app):
        engine.start(asyncio.get_running_loop())
        task = asyncio.create_task(register_loop(identity, settings)) if settings.gateway_url else None
        # the ballast's outputs formatted on this loop as a stream's would be (server/ballast_sink.py)
        sink = asyncio.create_task(absorb(api)) if ballast else None
        try:
            yield
        finally:
            for t in (task, sink):
                if t is not None:
                    t.cancel()
            await asyncio.get_running_loop().run_in_executor(None, engine.stop)
            api.close()

    # Per-request lines (a millisecond timestamp, the exact duration, the inner status) only with
    # --request-events, a measured switch; otherwise requests are seen in telemetry windows alone.
    events = settings.request_events
    attestation = attestation_handler(identity, settings.attestation_ttl_s, engine)
    routes = [
        Route("/pcc/v1/attestation", endpoint(COMPONENT, "attestation", attestation, events), methods=["GET"]),
        Route("/pcc/v1/ohttp-keys", endpoint(COMPONENT, "ohttp_keys", ohttp_keys, events), methods=["GET"]),
        Route("/pcc/v1/ohttp", endpoint(COMPONENT, "ohttp", ohttp, events), methods=["POST"]),
        *engine_routes(engine),
    ]
    return create_app(COMPONENT, routes, lifespan, events)
