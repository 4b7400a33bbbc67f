"""Non-targetable routing: which nodes a client is offered (threats T13 and T14, docs/threat-model.md).

The inputs are, by signature and nothing else: the model name, the nodes as
(node_id, model, capacity, healthy), k, and a random source. There is no parameter through
which a request, header, token or client address could reach the choice, so no one who
controls those can steer it: a node with capacity C_i is the first choice with probability
C_i / sum(C) over the healthy nodes serving the model, whoever asks.

K candidates are drawn without replacement, each draw weighted by capacity among the nodes
not yet drawn (successive sampling). The client sends its request to one of them; offering
several lets it skip a node whose attestation it refuses without a new round trip.
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass


class NoNodeAvailableError(LookupError):
    """No healthy node serves the requested model (HTTP 404)."""


@dataclass(frozen=True, slots=True)
class RoutingEntry:
    """What routing may know about a node: nothing about any request."""

    node_id: str
    model: str
    capacity: float
    healthy: bool

    def __post_init__(self) -> None:
        if isinstance(self.capacity, bool) or not (math.isfinite(self.capacity) and self.capacity > 0):
            raise ValueError("capacity must be a positive finite number")


def choose_nodes(
    model: str,
    nodes: Sequence[RoutingEntry],
    k: int,
    rng: random.Random | None = None,
) -> list[RoutingEntry]:
    """min(k, eligible) distinct healthy nodes serving `model`, drawn by capacity.

    `rng` defaults to the OS CSPRNG (`secrets.SystemRandom`); tests pass a seeded Random.
    Raises NoNodeAvailableError when no healthy node serves the model.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError("k must be a positive integer")
    rng = rng if rng is not None else secrets.SystemRandom()
    pool = [node for node in nodes if node.healthy and node.model == model]
    if not pool:
        raise NoNodeAvailableError("no healthy node serves this model")
    chosen = []
    for _ in range(min(k, len(pool))):
        chosen.append(pool.pop(_weighted_index(pool, rng)))
    return chosen


def _weighted_index(pool: Sequence[RoutingEntry], rng: random.Random) -> int:
    """Index i with probability capacity_i / sum(capacity)."""
    point = rng.random() * math.fsum(node.capacity for node in pool)
    cumulative = 0.0
    for i, node in enumerate(pool):
        cumulative += node.capacity
        if point < cumulative:
            return i
    return len(pool) - 1  # point landed on the total through float rounding
