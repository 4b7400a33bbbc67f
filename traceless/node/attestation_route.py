"""The node's attestation route, `GET /pcc/v1/attestation[?nonce=HEX]`: a document made now for the
verifier's nonce, the OHTTP keys it binds and, for a hardware node, the base document and the evidence
collected for it, which vouch for the key that signed the fresh document (evidence_cache.py).

Served by the node's app (app.py) and, without an engine, by audits and tests that need a node's
attestation behaviour only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from traceless.events import emit
from traceless.http.app import create_app, endpoint
from traceless.http.errors import ApiError
from traceless.node.evidence_cache import EvidenceRateLimitedError
from traceless.node.identity import NodeIdentity
from traceless.privacy.attestation.collectors import CollectorError
from traceless.privacy.attestation.hardware import HardwareAttester
from traceless.privacy.attestation.software import NONCE_MAX, NONCE_MIN


class EngineState(Protocol):
    """What the route reads of the node's engine (server/async_engine.py's AsyncEngine)."""

    @property
    def dead(self) -> bool: ...

    @property
    def restarting(self) -> bool: ...


def _nonce(request: Request) -> bytes | None:
    raw = request.query_params.get("nonce")
    try:
        nonce = bytes.fromhex(raw) if raw is not None else None
        if nonce is not None and not NONCE_MIN <= len(nonce) <= NONCE_MAX:
            raise ValueError
    except ValueError:
        raise ApiError(400, f"nonce must be {NONCE_MIN} to {NONCE_MAX} bytes in hex", param="nonce") from None
    return nonce


def attestation_handler(
    identity: NodeIdentity, ttl_s: int, engine: EngineState | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """The route's handler: documents valid for `ttl_s` seconds. With `engine`, a node whose engine
    cannot serve attests nothing: it is not offered to clients, and the gateway's health check drops it
    at once when the engine has stopped for good."""

    async def attestation(request: Request) -> Response:
        if engine is not None and engine.dead:
            raise ApiError(503, "the node's engine has stopped", type="server_error", code="engine_dead")
        if engine is not None and engine.restarting:
            raise ApiError(
                503,
                "the node's engine is restarting; retry later",
                type="server_error",
                code="engine_restarting",
                headers={"Retry-After": "1"},
            )
        nonce = _nonce(request)
        try:
            # A hardware node may have to collect evidence (blocking): off the event loop.
            hardware = identity.attestation_kind == HardwareAttester.attester_type
            made = (
                await asyncio.to_thread(identity.attest_now, nonce, ttl_s)
                if hardware
                else identity.attest_now(nonce, ttl_s)
            )
        except CollectorError:
            # No document without the evidence that vouches for it; the reason stays in the node.
            emit("node.evidence_unavailable", route="attestation")
            raise ApiError(
                503,
                "the node could not collect hardware evidence now; retry later",
                type="server_error",
                code="evidence_unavailable",
                headers={"Retry-After": "5"},
            ) from None
        except EvidenceRateLimitedError as exc:
            emit("node.evidence_capped", route="attestation")
            raise ApiError(
                503,
                "the node's hardware evidence is due for renewal and collected at most once per "
                f"{identity.evidence_cache.limits.min_interval_s:g} s; retry later",
                type="server_error",
                code="evidence_rate_limited",
                headers={"Retry-After": str(exc.retry_after_s)},
            ) from None
        return JSONResponse(made.to_json())

    return attestation


def attestation_app(identity: NodeIdentity, ttl_s: int = 300) -> Starlette:
    """An app serving only the attestation route, as the node does (no engine behind it)."""
    route = Route(
        "/pcc/v1/attestation", endpoint("node", "attestation", attestation_handler(identity, ttl_s)), methods=["GET"]
    )
    return create_app("node", [route])
