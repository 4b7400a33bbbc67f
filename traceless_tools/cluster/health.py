"""Health: a node is healthy when it proves, now, that it is the node registered there.

Every `interval_s`, the gateway asks every node at once for a fresh attestation
(`GET {node}/pcc/v1/attestation?nonce=` with a nonce of its own) and checks it under the node's
registered attester key: signature, nonce, validity, the URL and the capacity registered, and,
under an evidence policy, the hardware evidence (over the node's base document) that must vouch
for that key. A pass
needs all of them within `timeout_s`; anything else (error status, timeout, refused connection, a
document by another key: someone else answering at that URL) is a failure. A bare `/health` 200
proves nothing about who answered, so it is not used. The registry counts consecutive failures
and drops a node at its threshold, except for two answers that need no second look: a node that
says its engine has stopped (503 `engine_dead`: it attests nothing until a fresh process replaces
it) and a refused connection (nothing listens at that URL) are dropped at once. Either answer can
only take a node out of rotation, never put one in, so whoever gives it gains nothing a failed
check would not give them.

`fresh_attestation` is the same check with a client's nonce, for the candidate list: a client
that sends a nonce gets documents made for it, and a node that cannot produce one is not offered.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import os
from collections.abc import Callable
from enum import Enum

import httpx

from traceless.errors import InvalidRequestError
from traceless.events import emit
from traceless.http.errors import ApiError
from traceless.privacy.attestation.hardware import evidence_to_json
from traceless_tools.cluster.admission import AdmissionPolicy, verify_document
from traceless_tools.cluster.registry import NodeRecord, NodeRegistry, parse_evidence


class Gone(Enum):
    """A failed check that drops the node at once (see the module's docstring)."""

    ENGINE_DEAD = "engine_dead"
    UNREACHABLE = "unreachable"


async def fresh_attestation(
    client: httpx.AsyncClient, record: NodeRecord, nonce: bytes, timeout_s: float, policy: AdmissionPolicy
) -> dict | None:
    """{"attestation", "ohttp_keys", "evidence", "base_attestation"} made now by the registered node for
    `nonce`, or None. The evidence (collected once per key set, over the base document, whose key
    signed the fresh one) is checked under the gateway's evidence policy as at registration, and
    forwarded with its base so a client can check it under its own."""
    result = await attest_now(client, record, nonce, timeout_s, policy)
    return result if isinstance(result, dict) else None


async def attest_now(
    client: httpx.AsyncClient, record: NodeRecord, nonce: bytes, timeout_s: float, policy: AdmissionPolicy
) -> dict | Gone | None:
    """`fresh_attestation`, telling apart the failures that drop a node at once (`Gone`)."""
    try:
        response = await client.get(
            f"{record.registration.url}/pcc/v1/attestation", params={"nonce": nonce.hex()}, timeout=timeout_s
        )
        body = response.json() if response.status_code in (200, 503) else None
    except httpx.ConnectError as exc:
        return Gone.UNREACHABLE if _refused(exc) else None
    except (httpx.HTTPError, ValueError):
        return None
    if response.status_code == 503:
        error = body.get("error") if isinstance(body, dict) else None
        return Gone.ENGINE_DEAD if isinstance(error, dict) and error.get("code") == "engine_dead" else None
    base = body.get("base_attestation") if isinstance(body, dict) else None
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("attestation"), str)
        or not isinstance(body.get("ohttp_keys"), str)
        or not isinstance(base, str | None)
    ):
        return None
    try:
        keys = base64.b64decode(body["ohttp_keys"], validate=True)
        evidence = parse_evidence(body.get("evidence", []))
        # Hardware evidence costs milliseconds of signature checks: off the event loop.
        check = functools.partial(
            verify_document, policy, record.attester_key, body["attestation"], keys, nonce, evidence, base
        )
        claims = await asyncio.to_thread(check) if evidence else check()
    except (ApiError, InvalidRequestError, binascii.Error, ValueError):
        return None
    if claims.node_url != record.registration.url or claims.capacity != record.capacity:
        return None
    return {
        "attestation": body["attestation"],
        "ohttp_keys": body["ohttp_keys"],
        "evidence": [evidence_to_json(item) for item in evidence],
        "base_attestation": base,
    }


def _refused(exc: BaseException) -> bool:
    """Whether the connection was refused (nothing listens there), not lost to a name or a timeout."""
    seen: BaseException | None = exc
    for _ in range(8):  # httpx -> httpcore -> OSError -> ConnectionRefusedError
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def check_all(
    registry: NodeRegistry,
    client: httpx.AsyncClient,
    timeout_s: float,
    policy: AdmissionPolicy,
    on_drop: Callable[[str], None] | None = None,
) -> int:
    """One round of checks; returns how many nodes it dropped (`on_drop(node_id)` for each)."""
    records = registry.records()
    results = await asyncio.gather(
        *(attest_now(client, record, os.urandom(16), timeout_s, policy) for record in records)
    )
    dropped = 0
    for record, result in zip(records, results):
        if isinstance(result, Gone):
            gone = registry.drop(record.node_id)
            reason = result.value
        else:
            gone = registry.record_health(record.node_id, result is not None)
            reason = "unhealthy"
        if gone:
            dropped += 1
            emit("gateway.node_dropped", failures=record.failures + 1, nodes=len(registry), reason=reason)
            if on_drop is not None:
                on_drop(record.node_id)
    return dropped


async def health_loop(
    registry: NodeRegistry,
    client: httpx.AsyncClient,
    interval_s: float,
    timeout_s: float,
    policy: AdmissionPolicy,
    on_drop: Callable[[str], None] | None = None,
) -> None:
    """Check every interval until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        await check_all(registry, client, timeout_s, policy, on_drop)
