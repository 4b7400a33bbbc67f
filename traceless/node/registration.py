"""A node registers with the gateway at start and again every interval, with a fresh attestation.

The body names no capacity: the gateway reads it from the attestation (which also binds the URL
and every live OHTTP key), and admits the node only if a logged release allows it. A refused or
failed registration is tried again after a short pause (the gateway may start after the node);
a refusal for a reason that will not change (4xx) is reported once per attempt as an event.
"""

from __future__ import annotations

import asyncio
import base64

import httpx

from traceless.events import emit
from traceless.node.evidence_cache import EvidenceRateLimitedError
from traceless.node.identity import NodeIdentity
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.collectors import CollectorError

RETRY_S = 2.0


def registration_body(identity: NodeIdentity, settings: NodeSettings) -> dict:
    """The registration: a fresh document, the keys it binds, the attester key and, for a hardware
    attester, the base document and its evidence (blocking when the evidence is due)."""
    made = identity.attest_now(None, settings.attestation_ttl_s)
    return {
        "url": identity.node_url,
        "model": settings.model_name,
        **made.to_json(),
        "attester_key": base64.b64encode(identity.attester.public_key.public_bytes_raw()).decode(),
    }


async def register_loop(identity: NodeIdentity, settings: NodeSettings) -> None:
    """Register with the gateway now and then again every interval (fresh attestation each time)."""
    gateway_url = settings.gateway_url
    if gateway_url is None:
        raise ValueError("registering needs the gateway's URL (settings.gateway_url)")
    async with httpx.AsyncClient(timeout=10) as client:
        while True:
            try:
                body = await asyncio.to_thread(registration_body, identity, settings)
                r = await client.post(gateway_url.rstrip("/") + "/pcc/v1/register", json=body)
                ok = r.status_code == 200
                emit("node.registered", ok=ok, status_code=r.status_code)
            except CollectorError:
                ok = False
                emit("node.evidence_unavailable", route="register")
            except EvidenceRateLimitedError:
                ok = False
                emit("node.evidence_capped", route="register")
            except httpx.HTTPError:
                ok = False
                emit("node.registered", ok=False, status_code=0)
            await asyncio.sleep(settings.register_interval_s if ok else min(RETRY_S, settings.register_interval_s))
