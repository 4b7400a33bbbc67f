"""A client-side check of non-targetability: are my requests answered by one node implausibly often?

The client draws its node itself, by the capacities the nodes' attestations claim (node_choice.py),
so a request drawn from a round of verified candidates lands on node i with probability
C_i / sum(C) of *that* round. The watch judges every answer against the round it was drawn from
(an expected count and variance summed per node, so a node that dropped out of later rounds, as
a dead node does, shifts no expectation), and counts nodes by attester key, not by the gateway's
node ids (which a gateway restart renames, and which aliases would multiply). A count more than
Z_LIMIT standard deviations above its expectation raises one warning per node.

A failed request keeps its draw (private_client.py): what is answered is what was drawn, so a
gateway that fails requests bound for honest nodes does not shift the answers, and plain faults
raise no warning. What it cannot see: a gateway that lists only the attacker's nodes to this
client from the start, with every answer succeeding, looks like a small honest cluster
(docs/private-path.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

MIN_OBSERVATIONS = 30
Z_LIMIT = 5.0


class RoutingWatch:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.expected: dict[str, float] = {}
        self.variance: dict[str, float] = {}
        self.total = 0
        self._warned: set[str] = set()

    @property
    def concentrated(self) -> bool:
        """Whether some node has answered implausibly often (the proxy's header and /status say so)."""
        return bool(self._warned)

    def observe(self, answered: str, capacities: Mapping[str, int]) -> str | None:
        """Count one answered request: the node (attester key) that answered, and the attested
        capacities of the round it was drawn from, by attester key."""
        total = math.fsum(capacities.values())
        if answered not in capacities or total <= 0:
            raise ValueError("the answering node must be one of the round's candidates")
        for node, capacity in capacities.items():
            p = capacity / total
            self.expected[node] = self.expected.get(node, 0.0) + p
            self.variance[node] = self.variance.get(node, 0.0) + p * (1 - p)
        self.counts[answered] = self.counts.get(answered, 0) + 1
        self.total += 1
        return self.check(answered)

    def check(self, node: str) -> str | None:
        if self.total < MIN_OBSERVATIONS or node in self._warned:
            return None
        expected, sd = self.expected.get(node, 0.0), math.sqrt(self.variance.get(node, 0.0)) or 1.0
        if (self.counts.get(node, 0) - expected) / sd > Z_LIMIT:
            self._warned.add(node)
            return (
                f"routing looks concentrated: one node answered {self.counts[node]} of {self.total} requests "
                f"(its attested capacity share predicts about {expected:.0f})"
            )
        return None

    def status(self) -> dict:
        """For the proxy's /status: counts only (no node identities)."""
        return {"answered": self.total, "concentrated": self.concentrated, "nodes_flagged": len(self._warned)}
