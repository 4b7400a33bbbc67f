"""Anonymous amplification, in `traceless audit targeting`: how much attestation work one listing
request makes every node do.

A nonce-bound listing (`GET /pcc/v1/nodes?nonce=`) makes the gateway ask every listed node for a
document made for that nonce. Each row sends LISTINGS such requests to a real gateway in front of
NODES nodes that serve the node's own attestation route (node/attestation_route.py) with a
hardware-shaped attester, and counts, per request and node, the documents signed and the evidence
collections made (what a real node pays in configfs-tsm and SPDM round trips):

    honest     a client's listing: a token of its own, a fresh nonce (an attacker spending
               its own tokens does the same, as often as its issuer quota allows)
    anonymous  the same listing without a token
    weakened   anonymous, against the design before: no token asked for listings (the
               gateway's `privacy=False` switch) and nodes that collect evidence for
               every document (`NodeIdentity.attestation` + `evidence`, no base)

The stand-in CPU report verifies under no evidence policy, so the nodes are put in the gateway's
registry directly (admission is measured elsewhere: tests/cluster/test_evidence_admission.py) and
the gateway lists none of them after its own check; what is measured is the work done before it.
A row passes when anonymous listings cost nodes nothing, honest ones one signature and no
collection each, and the weakened design shows one collection per node per
anonymous request (so the audit can see the attack).
"""

from __future__ import annotations

import base64
import os
from contextlib import ExitStack
from dataclasses import dataclass

import httpx

from traceless.http.app import create_app, endpoint
from traceless.http.serve import serve_in_thread
from traceless.node.attestation_route import attestation_app
from traceless.node.identity import NodeIdentity
from traceless.node.registration import registration_body
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.collectors import Collector, Evidence
from traceless.privacy.attestation.hardware import HardwareAttester
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import AttestationClaims
from traceless.privacy.privacypass import protocol as privacypass
from traceless.privacy.privacypass.http import format_authorization, parse_www_authenticate
from traceless.privacy.privacypass.wire import TokenChallenge
from traceless.privacy.translog.manifest import ReleaseManifest
from traceless.privacy.translog.release_index import ReleaseNotLoggedError
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app
from traceless_tools.cluster.registry import NodeRegistration

NODES = 3
LISTINGS = 20
MODEL = "audit-model"
MEASUREMENT = Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32)
ROWS = ("honest", "anonymous", "weakened")


class _StandInCpu(Collector):
    """A CPU report stand-in that counts its collections (the cost a real node pays)."""

    def __init__(self) -> None:
        self.collections = 0

    def collect(self, report_data: bytes) -> Evidence:
        self.collections += 1
        return Evidence(kind="snp", blob=b"stand-in report " + report_data, aux=b"", provider="audit")


class _CountingAttester(HardwareAttester):
    def __init__(self, cpu: _StandInCpu) -> None:
        super().__init__(cpu)
        self.cpu = cpu
        self.signed = 0

    def attest(self, claims: AttestationClaims) -> str:
        self.signed += 1
        return super().attest(claims)


class _NoReleases:
    def release_for(self, combined: bytes) -> ReleaseManifest:
        raise ReleaseNotLoggedError("admission is not part of this audit")


def _weakened_app(identity: NodeIdentity):
    """The attestation route before evidence was collected once per key: a document and fresh
    evidence for every nonce."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def attestation(request: Request) -> JSONResponse:
        document, keys = identity.attestation(bytes.fromhex(request.query_params["nonce"]), 300)
        return JSONResponse(
            {
                "attestation": document,
                "ohttp_keys": base64.b64encode(keys).decode(),
                "evidence": identity.evidence(document),
            }
        )

    return create_app("node", [Route("/pcc/v1/attestation", endpoint("node", "attestation", attestation))])


@dataclass(frozen=True, slots=True)
class AmplificationRow:
    strategy: str
    requests: int
    nodes: int
    statuses: tuple[int, ...]  # the distinct statuses the gateway answered
    signed: int  # documents the nodes signed for these requests, all nodes together
    collections: int  # evidence collections the nodes made for them

    @property
    def signed_per_request_node(self) -> float:
        return self.signed / (self.requests * self.nodes)

    @property
    def collections_per_request_node(self) -> float:
        return self.collections / (self.requests * self.nodes)

    @property
    def passed(self) -> bool:
        want = {"honest": (1.0, 0.0), "anonymous": (0.0, 0.0), "weakened": (1.0, 1.0)}
        return (self.signed_per_request_node, self.collections_per_request_node) == want[self.strategy]

    def to_json(self) -> dict:
        return {
            "strategy": self.strategy,
            "requests": self.requests,
            "nodes": self.nodes,
            "statuses": list(self.statuses),
            "signed_per_request_node": self.signed_per_request_node,
            "collections_per_request_node": self.collections_per_request_node,
            "passed": self.passed,
        }


def _tokens(issuer: privacypass.Issuer, www_authenticate: str, count: int) -> list[str]:
    challenge = TokenChallenge.decode(parse_www_authenticate(www_authenticate)[0].challenge)
    out = []
    for _ in range(count):
        request, state = privacypass.begin(challenge, issuer.public_key)
        out.append(format_authorization(privacypass.finalize(state, issuer.issue(request))))
    return out


def measure_row(strategy: str, nodes: int = NODES, listings: int = LISTINGS) -> AmplificationRow:
    """Run one row on a fresh gateway and fresh nodes."""
    if strategy not in ROWS:
        raise ValueError(f"unknown amplification row {strategy!r}")
    weakened = strategy == "weakened"
    issuer = privacypass.Issuer.generate()
    config = GatewayConfig(
        issuer_url="http://issuer.invalid", privacy=not weakened, health_interval_s=3600, issuer_refresh_s=3600
    )
    app = create_gateway_app(config, [issuer.public_key], releases=_NoReleases())
    attesters = [_CountingAttester(_StandInCpu()) for _ in range(nodes)]
    with ExitStack() as stack:
        gateway_url = stack.enter_context(serve_in_thread(app, what="gateway"))
        for attester in attesters:
            identity = NodeIdentity(attester, MEASUREMENT)
            node_app = _weakened_app(identity) if weakened else attestation_app(identity)
            identity.node_url = stack.enter_context(serve_in_thread(node_app, what="node"))
            body = registration_body(identity, NodeSettings(MODEL))
            raw_key = attester.public_key.public_bytes_raw()
            app.state.gateway.registry.register(NodeRegistration.from_json(body), raw_key, 1, 0)
        before = [(a.signed, a.cpu.collections) for a in attesters]
        http = stack.enter_context(httpx.Client(base_url=gateway_url, timeout=60))
        paid = strategy == "honest"
        tokens = _tokens(issuer, http.get("/pcc/v1/challenge").headers["www-authenticate"], listings) if paid else []
        statuses = set()
        for i in range(listings):
            headers = {"authorization": tokens[i]} if paid else {}
            r = http.get(
                "/pcc/v1/nodes", params={"model": MODEL, "k": nodes, "nonce": os.urandom(16).hex()}, headers=headers
            )
            statuses.add(r.status_code)
    signed = sum(a.signed - s for a, (s, _) in zip(attesters, before))
    collections = sum(a.cpu.collections - c for a, (_, c) in zip(attesters, before))
    return AmplificationRow(strategy, listings, nodes, tuple(sorted(statuses)), signed, collections)


def measure_amplification(nodes: int = NODES, listings: int = LISTINGS) -> list[AmplificationRow]:
    return [measure_row(strategy, nodes, listings) for strategy in ROWS]


def print_amplification(rows: list[dict]) -> None:
    print(
        f"\n{'listing requests':<18}{'requests':>9}{'nodes':>7}{'statuses':>12}{'signed/req/node':>17}"
        f"{'evidence/req/node':>19}  verdict"
    )
    for r in rows:
        statuses = ",".join(str(s) for s in r["statuses"])
        print(
            f"{r['strategy']:<18}{r['requests']:>9}{r['nodes']:>7}{statuses:>12}"
            f"{r['signed_per_request_node']:>17.2f}{r['collections_per_request_node']:>19.2f}  "
            f"{'ok' if r['passed'] else 'FAILED'}"
        )
    print(
        "Per nonce-bound listing request and node: documents signed and hardware evidence collections (the "
        "stand-in\nevidence verifies under no policy: the gateway lists nothing, 404). ok: an anonymous listing "
        "costs nodes\nnothing, a paid one one signature and no collection, and the weakened design (no token, "
        "evidence per\ndocument) one collection per node per anonymous request."
    )
