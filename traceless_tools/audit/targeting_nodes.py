"""Node stand-ins for running the real gateway in `traceless audit targeting`, and a loopback
server thread for ASGI apps.

The gateway only registers nodes, offers them and forwards ciphertext to them, so a node here
is what the gateway and a client can observe of one: a URL answering `/health`,
`/pcc/v1/attestation` (a fresh document for a nonce) and `/pcc/v1/ohttp`, a real OHTTP key pair
and real (software-attested) documents binding that key, the node's URL and its capacity, for the
audit's release (AUDIT_RELEASE, which allows capacities 1..MAX_AUDIT_CAPACITY). All nodes
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

from traceless.privacy.attestation.software import NodeStatement, SoftwareAttester, new_claims
from traceless.privacy.bhttp import message as bhttp
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless.privacy.translog.manifest import ReleaseManifest
from traceless.privacy.translog.release_index import ReleaseNotLoggedError

MAX_AUDIT_CAPACITY = 100
# What the audit's nodes run: a release that allows capacities 1..MAX_AUDIT_CAPACITY, and no more, with
# the settings the client's release policy requires.
AUDIT_RELEASE = ReleaseManifest(
    b"\xa1" * 32,
    b"\xa2" * 32,
    {
        "component": "audit-node",
        "prefix_cache": "isolated",
        "shape_padding": "buckets",
        "scrub_freed_memory": True,
        "load_format": "auto",
        "request_events": False,
        "metrics_epsilon": 1.0,
    },
    tuple(range(1, MAX_AUDIT_CAPACITY + 1)),
)


class AuditReleases:
    """The ReleaseLookup of the audit's gateway and client: the audit's release is the logged one."""

    def release_for(self, combined: bytes) -> ReleaseManifest:
        if combined != AUDIT_RELEASE.combined:
            raise ReleaseNotLoggedError("no logged release has this measurement")
        return AUDIT_RELEASE


@dataclass(eq=False)
class AuditNode:
    """One node: its keys, and counters the farm's event loop updates."""

    name: str
    capacity: int
    attacker: bool
    ohttp: OhttpServer = field(default_factory=lambda: OhttpServer(key_id=1), repr=False)
    attester: SoftwareAttester = field(default_factory=SoftwareAttester, repr=False)
    inflight: int = 0
    served: int = 0

    url: str = ""  # where it serves: set by the farm

    def document(
        self,
        nonce: bytes,
        capacity: int | None = None,
        url: str | None = None,
        ttl_s: int = 300,
        now: float | None = None,
    ) -> str:
        """A signed attestation of this node's key, URL and capacity (either may be overridden: a lie)."""
        statement = NodeStatement(
            AUDIT_RELEASE.measurement,
            self.ohttp.ohttp_keys(),
            self.capacity if capacity is None else capacity,
            self.url if url is None else url,
        )
        claims = new_claims(
            statement, nonce, int(time.time() if now is None else now), self.attester.attester_type, ttl_s
        )
        return self.attester.attest(claims)

    def registration(self, model: str, *, capacity: int | None = None, url: str | None = None) -> dict:
        """The body of POST /pcc/v1/register, with a fresh signed attestation."""
        return {
            "url": self.url if url is None else url,
            "model": model,
            "attestation": self.document(os.urandom(16), capacity, url),
            "ohttp_keys": base64.b64encode(self.ohttp.ohttp_keys()).decode(),
            "attester_key": base64.b64encode(self.attester.public_key.public_bytes_raw()).decode(),
        }

    @property
    def attester_key(self) -> bytes:
        return self.attester.public_key.public_bytes_raw()


class NodeFarm:
    """The audit's nodes behind one Starlette app: GET /{name}/health, POST /{name}/pcc/v1/ohttp."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.url = ""  # the farm's base URL, set once it serves
        self.nodes: dict[str, AuditNode] = {}
        self.app = Starlette(
            routes=[
                Route("/{name}/health", self._health, methods=["GET"]),
                Route("/{name}/pcc/v1/attestation", self._attestation, methods=["GET"]),
                Route("/{name}/pcc/v1/ohttp", self._ohttp, methods=["POST"]),
            ]
        )

    def add(self, name: str, capacity: int, attacker: bool) -> AuditNode:
        if name in self.nodes:
            raise ValueError(f"node {name!r} already exists")
        self.nodes[name] = node = AuditNode(name, capacity, attacker, url=f"{self.url}/{name}")
        return node

    async def _attestation(self, request: Request) -> Response:
        node = self.nodes.get(request.path_params["name"])
        if node is None:
            return JSONResponse({"error": "no such node"}, status_code=404)
        document = node.document(bytes.fromhex(request.query_params["nonce"]))
        return JSONResponse({"attestation": document, "ohttp_keys": base64.b64encode(node.ohttp.ohttp_keys()).decode()})

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
