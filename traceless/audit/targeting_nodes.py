"""Node stand-ins for running the real gateway in `traceless audit targeting`, and a loopback
server thread for ASGI apps.

The gateway only registers nodes, offers them and forwards ciphertext to them, so a node here
is what the gateway can observe of one: a URL answering `/health` and `/pcc/v1/ohttp`, a real
OHTTP key pair and a real (software-attested) attestation document binding that key. All nodes
share one loopback server, each under its own path (`{url}/{name}`). Honest nodes hold every
request for `hold_s` (they do the work; that is the load an attacker's flood creates); the
attacker's nodes answer at once. Counters are kept per node; no request content is kept.
"""
from __future__ import annotations

import asyncio
import base64
import os
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import SoftwareAttester, new_claims
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.ohttp.gateway import OhttpServer

# What the audit's nodes claim to run; no client verifies it here (the gateway passes it on).
AUDIT_MEASUREMENT = Measurement(b"\xa1" * 32, b"\xa2" * 32, b"\xa3" * 32)


@dataclass(eq=False)
class AuditNode:
    """One node: its keys, and counters the farm's event loop updates."""

    name: str
    capacity: float
    attacker: bool
    ohttp: OhttpServer = field(default_factory=lambda: OhttpServer(key_id=1), repr=False)
    attester: SoftwareAttester = field(default_factory=SoftwareAttester, repr=False)
    inflight: int = 0
    served: int = 0

    def registration(self, farm_url: str, model: str, ttl_s: int = 3600) -> dict:
        """The body of POST /pcc/v1/register, with a fresh signed attestation of this node's key."""
        claims = new_claims(AUDIT_MEASUREMENT, self.ohttp.key_config.encode(), os.urandom(16),
                            int(time.time()), self.attester.attester_type, ttl_s)
        return {"url": f"{farm_url}/{self.name}", "model": model, "capacity": self.capacity,
                "attestation": self.attester.attest(claims),
                "ohttp_keys": base64.b64encode(self.ohttp.ohttp_keys()).decode()}


class NodeFarm:
    """The audit's nodes behind one Starlette app: GET /{name}/health, POST /{name}/pcc/v1/ohttp."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.nodes: dict[str, AuditNode] = {}
        self.app = Starlette(routes=[
            Route("/{name}/health", self._health, methods=["GET"]),
            Route("/{name}/pcc/v1/ohttp", self._ohttp, methods=["POST"]),
        ])

    def add(self, name: str, capacity: float, attacker: bool) -> AuditNode:
        if name in self.nodes:
            raise ValueError(f"node {name!r} already exists")
        self.nodes[name] = node = AuditNode(name, capacity, attacker)
        return node

    def inflight(self, attacker: bool) -> int:
        return sum(n.inflight for n in list(self.nodes.values()) if n.attacker == attacker)

    def served(self, attacker: bool) -> int:
        return sum(n.served for n in list(self.nodes.values()) if n.attacker == attacker)

    async def _health(self, request: Request) -> Response:
        known = request.path_params["name"] in self.nodes
        return JSONResponse({"status": "ok" if known else "unknown"}, status_code=200 if known else 404)

    async def _ohttp(self, request: Request) -> Response:
        node = self.nodes.get(request.path_params["name"])
        if node is None:
            return JSONResponse({"error": "no such node"}, status_code=404)
        inner, context = node.ohttp.decapsulate_request(await request.body())
        bhttp.decode_request(inner)  # a well-formed request, as a real node would insist
        node.inflight += 1
        try:
            if not node.attacker:
                await asyncio.sleep(self.hold_s)
        finally:
            node.inflight -= 1
            node.served += 1
        reply = bhttp.encode_response(bhttp.Response(200, content=b'{"object": "chat.completion"}'))
        return Response(context.encapsulate(reply), media_type="message/ohttp-res")
