"""Background health checks of registered nodes (the gateway's only outbound polling).

Every `interval_s`, `GET {node}/health` for every node at once; a 200 within `timeout_s` is a
pass, anything else (error status, timeout, refused connection) a failure. The registry
counts consecutive failures and drops a node at its threshold.
"""
from __future__ import annotations

import asyncio

import httpx

from traceless.cluster.registry import NodeRegistry
from traceless.events import emit


async def _passes(client: httpx.AsyncClient, url: str, timeout_s: float) -> bool:
    try:
        response = await client.get(f"{url}/health", timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


async def check_all(registry: NodeRegistry, client: httpx.AsyncClient, timeout_s: float) -> int:
    """One round of checks; returns how many nodes it dropped."""
    records = registry.records()
    results = await asyncio.gather(
        *(_passes(client, record.registration.url, timeout_s) for record in records)
    )
    dropped = 0
    for record, ok in zip(records, results):
        if registry.record_health(record.node_id, ok):
            dropped += 1
            emit("gateway.node_dropped", failures=record.failures + 1, nodes=len(registry))
    return dropped


async def health_loop(
    registry: NodeRegistry, client: httpx.AsyncClient, interval_s: float, timeout_s: float
) -> None:
    """Check every interval until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        await check_all(registry, client, timeout_s)
