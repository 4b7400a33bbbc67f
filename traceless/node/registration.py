"""A node registers with the gateway at start and again every interval, with a fresh attestation."""
from __future__ import annotations

import asyncio
import base64

import httpx

from traceless.events import emit
from traceless.node.identity import NodeIdentity
from traceless.node.settings import NodeSettings


async def register_loop(identity: NodeIdentity, settings: NodeSettings) -> None:
    """Register with the gateway now and then again every interval (fresh attestation each time)."""
    gateway_url = settings.gateway_url
    if gateway_url is None:
        raise ValueError("registering needs the gateway's URL (settings.gateway_url)")
    async with httpx.AsyncClient(timeout=10) as client:
        while True:
            body = {"url": settings.public_url, "model": settings.model_name, "capacity": settings.capacity,
                    "attestation": identity.attestation(None, settings.attestation_ttl_s),
                    "ohttp_keys": base64.b64encode(identity.ohttp_keys).decode()}
            try:
                r = await client.post(gateway_url.rstrip("/") + "/pcc/v1/register", json=body)
                emit("node.registered", ok=r.status_code == 200, status_code=r.status_code)
            except httpx.HTTPError:
                emit("node.registered", ok=False, status_code=0)
            await asyncio.sleep(settings.register_interval_s)
