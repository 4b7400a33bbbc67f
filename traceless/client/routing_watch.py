"""A client-side check of non-targetability: is some node offered to me implausibly often?

The gateway must pick the first candidate with probability capacity / total capacity. The client
counts which node it is offered first and compares with the capacity shares it has seen; a count
more than 5 standard deviations above its binomial expectation triggers one warning per node.
"""
from __future__ import annotations

import math

MIN_OBSERVATIONS = 30
Z_LIMIT = 5.0


class RoutingWatch:
    def __init__(self) -> None:
        self.first_counts: dict[str, int] = {}
        self.capacities: dict[str, int] = {}
        self.total = 0
        self._warned: set[str] = set()

    def observe(self, first: dict, offered: list[dict]) -> str | None:
        for entry in offered:
            self.capacities[str(entry.get("node_id"))] = int(entry.get("capacity", 1))
        node = str(first.get("node_id"))
        self.first_counts[node] = self.first_counts.get(node, 0) + 1
        self.total += 1
        return self.check(node)

    def check(self, node: str) -> str | None:
        n = self.total
        cap_sum = sum(self.capacities.values())
        if n < MIN_OBSERVATIONS or node in self._warned or cap_sum == 0:
            return None
        p = self.capacities.get(node, 1) / cap_sum
        expected, sd = n * p, math.sqrt(n * p * (1 - p)) or 1.0
        z = (self.first_counts[node] - expected) / sd
        if z > Z_LIMIT:
            self._warned.add(node)
            return (f"routing looks concentrated: one node was offered first {self.first_counts[node]} times out "
                    f"of {n} (its capacity share predicts about {expected:.0f})")
        return None
