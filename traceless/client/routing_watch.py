"""A client-side check of non-targetability: do my requests end up on one node implausibly often?

The client draws its node itself, by the capacities the nodes' attestations claim (node_choice.py),
so its requests should land on node i with probability C_i / sum(C) over the verified candidates.
What the watch counts is where requests were *answered*: a gateway that lets requests to honest
nodes fail (a 502, a dropped stream) so that only the attacker's answer, or a candidate list cut
down to the attacker's nodes, shows up as one node answering more than its attested share. It
judges shares by attested capacities only (never a number the gateway announces); a count more
than 5 standard deviations above its binomial expectation triggers one warning per node.

What it cannot see: a gateway that lists only the attacker's nodes to this client from the start,
with every answer succeeding, looks like a small honest cluster (see docs/private-path.md).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

MIN_OBSERVATIONS = 30
Z_LIMIT = 5.0


class RoutingWatch:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.capacities: dict[str, int] = {}
        self.total = 0
        self._warned: set[str] = set()

    def observe(self, answered: str, capacities: Mapping[str, int]) -> str | None:
        """Count one answered request: the node that answered and the attested capacities of the
        candidates it was drawn from."""
        self.capacities.update(capacities)
        self.counts[answered] = self.counts.get(answered, 0) + 1
        self.total += 1
        return self.check(answered)

    def check(self, node: str) -> str | None:
        n = self.total
        cap_sum = sum(self.capacities.values())
        if n < MIN_OBSERVATIONS or node in self._warned or cap_sum == 0:
            return None
        p = self.capacities.get(node, 1) / cap_sum
        expected, sd = n * p, math.sqrt(n * p * (1 - p)) or 1.0
        z = (self.counts[node] - expected) / sd
        if z > Z_LIMIT:
            self._warned.add(node)
            return (f"routing looks concentrated: one node answered {self.counts[node]} of {n} requests "
                    f"(its attested capacity share predicts about {expected:.0f})")
        return None
