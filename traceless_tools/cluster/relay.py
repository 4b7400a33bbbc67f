"""The OHTTP relay (`traceless relay --gateway URL`): hides the client's address from the gateway.

    GET  /pcc/v1/challenge           -> gateway, same path
    GET  /pcc/v1/nodes?...           -> gateway, same path and query
    POST /pcc/v1/ohttp/{node_id}     -> gateway, same path, body and response streamed (body capped)

It sees the client's address, never content (requests are encrypted to a node). Upstream it
sends only `content-type` and `authorization` (the anonymous token), and its own framing (a body
is always sent chunked, as it arrives, whatever framing the client chose): no forwarding header
(X-Forwarded-For, Forwarded, Via), no cookie or user agent, nothing the client's software
could be recognised by. Downstream it passes only the status, `content-type` and
`www-authenticate`. Every other path is 404. Logging is schema events only: route, status,
duration; never an address.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from traceless.http.app import create_app, endpoint
from traceless.http.body import stream_body
from traceless.http.upstream import UpstreamStream, upstream_client, upstream_error

COMPONENT = "relay"
UPSTREAM_REQUEST_HEADERS = ("content-type", "authorization")
DOWNSTREAM_RESPONSE_HEADERS = ("content-type", "www-authenticate")


@dataclass(frozen=True, slots=True)
class RelayConfig:
    gateway_url: str
    max_body_bytes: int = 8 * 2**20
    read_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.gateway_url.startswith(("http://", "https://")):
            raise ValueError("gateway_url must be an http(s) URL")
        if self.max_body_bytes < 1 or not self.read_timeout_s > 0:
            raise ValueError("max_body_bytes and read_timeout_s must be positive")


class Relay:
    """Forwards the three routes; holds one upstream client opened by the app's lifespan."""

    def __init__(self, config: RelayConfig) -> None:
        self._config = config
        self._base = config.gateway_url.rstrip("/")
        self._client: httpx.AsyncClient | None = None

    @asynccontextmanager
    async def lifespan(self, app: Starlette):
        self._client = upstream_client(self._config.read_timeout_s)
        try:
            yield
        finally:
            await self._client.aclose()

    async def challenge(self, request: Request) -> Response:
        return await self._forward(request, "GET", "/pcc/v1/challenge", None)

    async def nodes(self, request: Request) -> Response:
        return await self._forward(request, "GET", "/pcc/v1/nodes", None)

    async def ohttp(self, request: Request) -> Response:
        # Streamed both ways: the body goes on to the gateway as it arrives (a declared length
        # over the cap is refused first, a chunked body as soon as it passes the cap), and the
        # relay holds no request's body whole.
        # Upstream the body is always chunked, whatever framing the client used: how a client frames
        # its body is a trait of its software, which the gateway is not to learn.
        _, body = stream_body(request, self._config.max_body_bytes)
        path = "/pcc/v1/ohttp/" + quote(request.path_params["node_id"], safe="")
        return await self._forward(request, "POST", path, body)

    async def _forward(self, request: Request, method: str, path: str, body: AsyncIterator[bytes] | None) -> Response:
        query = request.url.query
        url = self._base + path + (f"?{query}" if query else "")
        headers = {name: request.headers[name] for name in UPSTREAM_REQUEST_HEADERS if name in request.headers}
        client = self._client
        if client is None:
            raise RuntimeError("the relay's upstream client is not open: the app's lifespan has not started")
        upstream_request = client.build_request(method, url, content=body, headers=headers)
        try:
            upstream = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            raise upstream_error(exc) from None
        passed = {name: upstream.headers[name] for name in DOWNSTREAM_RESPONSE_HEADERS if name in upstream.headers}
        return UpstreamStream(upstream, passed, COMPONENT)


def create_relay_app(config: RelayConfig) -> Starlette:
    relay = Relay(config)
    routes = [
        Route("/pcc/v1/challenge", endpoint(COMPONENT, "challenge", relay.challenge), methods=["GET"]),
        Route("/pcc/v1/nodes", endpoint(COMPONENT, "nodes", relay.nodes), methods=["GET"]),
        Route("/pcc/v1/ohttp/{node_id}", endpoint(COMPONENT, "ohttp", relay.ohttp), methods=["POST"]),
    ]
    return create_app(COMPONENT, routes, relay.lifespan)
