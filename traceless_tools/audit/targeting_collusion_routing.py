"""The routing attacks of colluding hops in `traceless audit targeting` (rows as targeting_collusion.py;
metric: P(a target request is answered by the attacker's nodes T), fair level T's capacity share).

Nodes are the audit's attested nodes (targeting_nodes.AuditNode: real OHTTP keys, signed documents
for the client's nonce, the audit's logged release); the client's side is the real NodeVerifier,
draw (node_choice) and kept draws; the gateway's side is what the attack changes:
    node_aliases    the listing repeats each attacker node under ALIASES more node ids (every copy
                    verifies: same node, same key). Weakened: a client that verifies entries one
                    by one and draws among all of them.
    retry_steering  the gateway fails (502) every request not bound for T; the caller (the openai
                    SDK's default) tries each request 3 times. Weakened: every attempt a fresh draw.
"""

from __future__ import annotations

import base64
import random
import secrets
from collections.abc import Callable

from traceless.privacy.attestation.policy import AttesterPolicy
from traceless_tools.audit.targeting_collusion import Cell, CollusionRow
from traceless_tools.audit.targeting_estimate import Scenario
from traceless_tools.audit.targeting_nodes import AuditNode, AuditReleases
from traceless_tools.client.node_choice import Draws, draw_node
from traceless_tools.client.node_verifier import DuplicateListingError, NodeRefused, NodeVerifier, VerifiedNode
from traceless_tools.client.private_client import ClientConfig

ALIASES = 8
ATTEMPTS = 3  # the openai SDK: the call and two retries
ROUND_EVERY = 25  # target requests per fresh candidate round (the client's maximum attestation age)


class _Cluster:
    def __init__(self, scenario: Scenario) -> None:
        self.nodes = [
            AuditNode(f"node{i}", int(c), i in scenario.attacker_nodes, url=f"http://audit.farm/node{i}")
            for i, c in enumerate(scenario.capacities)
        ]
        self.share = sum(n.capacity for n in self.nodes if n.attacker) / sum(n.capacity for n in self.nodes)
        config = ClientConfig(
            "http://unused",
            "unused",
            "http://unused",
            "http://127.0.0.1:9",
            bytes(32),
            tuple(n.attester_key for n in self.nodes),
            "m",
            attester_policy=AttesterPolicy.DEVELOPMENT,
        )
        self.verifier = NodeVerifier(config, releases=AuditReleases())
        self.attacker_urls = {n.url for n in self.nodes if n.attacker}  # the URL each document attests

    def listing(self, nonce: bytes, aliases: int) -> list[dict]:
        """What the gateway lists for the client's nonce: each node once, attacker nodes `aliases` more times."""
        out = []
        for node in self.nodes:
            document = node.document(nonce)
            keys = base64.b64encode(node.ohttp.ohttp_keys()).decode()
            for _ in range(1 + (aliases if node.attacker else 0)):
                out.append({"node_id": secrets.token_hex(16), "attestation": document, "ohttp_keys": keys})
        return out

    def verified(self, aliases: int, weakened: bool) -> list[VerifiedNode]:
        nonce = secrets.token_bytes(32)
        offered = self.listing(nonce, aliases)
        if not weakened:
            nodes = self.verifier.verify_all(offered, nonce)  # DuplicateListingError: the round is refused
        else:
            nodes = []
            for entry in offered:
                try:
                    nodes.append(self.verifier.verify(entry, expected_nonce=nonce))
                except NodeRefused:
                    pass
        return nodes

    def close(self) -> None:
        self.verifier.close()


def _requests(
    cluster: _Cluster, n: int, send: Callable[[list[VerifiedNode]], VerifiedNode | None], aliases: int, weakened: bool
) -> Cell:
    """n target requests, a fresh round every ROUND_EVERY; success: answered by T."""
    hits, nodes = 0, []
    for k in range(n):
        if k % ROUND_EVERY == 0:
            try:
                nodes = cluster.verified(aliases, weakened)
            except DuplicateListingError:
                nodes = []  # the round is refused: the request fails, nothing is sent
        answered = send(nodes) if nodes else None
        hits += answered is not None and answered.node_url in cluster.attacker_urls
    return Cell(hits, n)


def node_aliases(cluster: _Cluster, n: int, rng: random.Random) -> tuple[Cell, Cell, Cell]:
    def once(nodes: list[VerifiedNode]) -> VerifiedNode:
        return draw_node(nodes, rng)

    return (
        _requests(cluster, n, once, 0, False),
        _requests(cluster, n, once, ALIASES, False),
        _requests(cluster, n, once, ALIASES, True),
    )


def retry_steering(cluster: _Cluster, n: int, rng: random.Random) -> tuple[Cell, Cell, Cell]:
    def steering_sender(draws: Draws | None, attack: bool) -> Callable[[list[VerifiedNode]], VerifiedNode | None]:
        def send(nodes: list[VerifiedNode]) -> VerifiedNode | None:
            for _ in range(ATTEMPTS):
                node = draws.take(nodes) if draws is not None else draw_node(nodes, rng)
                if not attack or node.node_url in cluster.attacker_urls:
                    return node  # answered
                if draws is not None:
                    draws.keep(node)  # the gateway answered 502: our client keeps the draw
            return None

        return send

    return (
        _requests(cluster, n, steering_sender(Draws(rng), False), 0, False),
        _requests(cluster, n, steering_sender(Draws(rng), True), 0, False),
        _requests(cluster, n, steering_sender(None, True), 0, True),
    )


def measure_collusion_routing(scenario: Scenario, requests: int) -> list[CollusionRow]:
    seed = f"{scenario.seed}:collusion" if scenario.seed is not None else secrets.randbits(64)
    rng = random.Random(seed)
    cluster = _Cluster(scenario)
    try:
        metric = "P(target request answered by T)"
        return [
            CollusionRow(
                "node_aliases",
                metric,
                cluster.share,
                *node_aliases(cluster, requests, rng),
                {"aliases_per_attacker_node": ALIASES},
            ),
            CollusionRow(
                "retry_steering",
                metric,
                cluster.share,
                *retry_steering(cluster, requests, rng),
                {"attempts_per_request": ATTEMPTS},
            ),
        ]
    finally:
        cluster.close()
