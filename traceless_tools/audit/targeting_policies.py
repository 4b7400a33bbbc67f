"""Routing policies for `traceless audit targeting`: the interface, the cluster state production
routers read, and SIMULATIONS of the routers other systems use.

These classes are models of other routers (least-loaded, user affinity, prefix-cache-aware,
priority pools), written to show how an attacker steers them. Ours is not here: the
`capacity_random` policy drives the real gateway over HTTP (targeting_gateway.py).

Every policy sees the same inputs: the request's observable features (user id, prompt blocks,
user class: they exist for these policies; ours never receives them), the nodes (capacity,
owner) and the state the harness keeps (in-flight requests, cached prefixes).
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from abc import ABC, abstractmethod
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

PREMIUM = "premium"
STANDARD = "standard"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One server: its name (what a router may hash), capacity C(S_i), and who controls it."""

    name: str
    capacity: float
    attacker: bool

    def __post_init__(self) -> None:
        if not (math.isfinite(self.capacity) and self.capacity > 0):
            raise ValueError("capacity must be a positive finite number")


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What a router could observe of a request. `prompt` is a tuple of opaque block labels
    (prefix caches match whole blocks); no real user data is ever generated."""

    user_id: str
    prompt: tuple[str, ...] = field(repr=False)
    user_class: str = STANDARD


@dataclass(slots=True)
class ClusterState:
    """Nodes plus what routers track about them: requests in flight and cached prompt prefixes.

    Time advances in rounds; a request admitted for `duration` rounds stays in flight until
    then (0: it ends at once). Each node's prefix cache is an LRU of prefixes holding
    `cache_per_capacity * capacity` entries (a bigger node has more KV memory).
    """

    nodes: list[NodeSpec]
    cache_per_capacity: int = 24
    round: int = 0
    inflight: list[int] = field(init=False)
    caches: list[OrderedDict] = field(init=False, repr=False)
    finishing: dict[int, list[int]] = field(init=False, repr=False)  # round -> nodes freed then

    def __post_init__(self) -> None:
        self.inflight = [0] * len(self.nodes)
        self.caches = [OrderedDict() for _ in self.nodes]
        self.finishing = defaultdict(list)

    def advance(self) -> None:
        self.round += 1
        for i in self.finishing.pop(self.round, ()):
            self.inflight[i] -= 1

    def load(self, i: int) -> float:
        """In-flight requests per unit of capacity (what a capacity-aware least-loaded reads)."""
        return self.inflight[i] / self.nodes[i].capacity

    def admit(self, i: int, request: RequestFeatures, duration: int) -> None:
        if duration > 0:
            self.inflight[i] += 1
            self.finishing[self.round + duration].append(i)
        self.cache(i, request.prompt)

    def cache(self, i: int, prompt: Sequence[str]) -> None:
        """Insert every block prefix of `prompt` (most recently used); evict the oldest."""
        lru, limit = self.caches[i], max(1, round(self.cache_per_capacity * self.nodes[i].capacity))
        for n in range(1, len(prompt) + 1):
            key = tuple(prompt[:n])
            lru[key] = None
            lru.move_to_end(key)
        while len(lru) > limit:
            lru.popitem(last=False)

    def match(self, i: int, prompt: Sequence[str]) -> int:
        """Blocks of the longest prefix of `prompt` that node i has cached."""
        lru = self.caches[i]
        for n in range(len(prompt), 0, -1):
            if tuple(prompt[:n]) in lru:
                return n
        return 0

    def share(self, indices: Iterable[int] | None = None) -> float:
        """sum C(T) / sum C(S) for T = the attacker's nodes (or `indices`)."""
        chosen = set(indices) if indices is not None else {i for i, n in enumerate(self.nodes) if n.attacker}
        total = math.fsum(n.capacity for n in self.nodes)
        return math.fsum(n.capacity for i, n in enumerate(self.nodes) if i in chosen) / total


class RoutingPolicy(ABC):
    """Chooses the node (an index into `state.nodes`) for one request.

    Contract: `choose` returns a valid index and does not modify `state` (the harness admits
    the request afterwards). `simulated` is True for models of other routers, False for ours,
    which calls the real gateway.
    """

    name: ClassVar[str]
    simulated: ClassVar[bool] = True

    @abstractmethod
    def choose(self, request: RequestFeatures, state: ClusterState) -> int: ...


def weighted_pick(rng: random.Random, nodes: Sequence[NodeSpec], indices: Sequence[int]) -> int:
    """One of `indices` with probability proportional to capacity."""
    return rng.choices(list(indices), weights=[nodes[i].capacity for i in indices])[0]


def _least_loaded(rng: random.Random, state: ClusterState, indices: Sequence[int]) -> int:
    """Lowest in-flight per capacity; ties capacity-weighted (fair to big nodes when idle)."""
    loads = [state.load(i) for i in indices]
    low = min(loads)
    return weighted_pick(rng, state.nodes, [i for i, load in zip(indices, loads) if load == low])


class LeastLoaded(RoutingPolicy):
    """SIMULATION: the node with the fewest in-flight requests per unit capacity."""

    name = "least_loaded"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, request: RequestFeatures, state: ClusterState) -> int:
        return _least_loaded(self._rng, state, range(len(state.nodes)))


def ring_position(label: str) -> int:
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big")


class UserAffinity(RoutingPolicy):
    """SIMULATION: consistent hashing of the user id onto a ring of virtual nodes, each node
    getting `vnodes_per_capacity * capacity` points at sha256(name#j) (session affinity)."""

    name = "user_affinity"

    def __init__(self, nodes: Sequence[NodeSpec], vnodes_per_capacity: int = 16) -> None:
        self._per_capacity = vnodes_per_capacity
        self.rebuild(nodes)

    def rebuild(self, nodes: Sequence[NodeSpec]) -> None:
        points = []
        for i, node in enumerate(nodes):
            for j in range(max(1, round(self._per_capacity * node.capacity))):
                points.append((ring_position(f"{node.name}#{j}"), i))
        points.sort()
        self._positions = [p for p, _ in points]
        self._owners = [i for _, i in points]

    def successor(self, position: int) -> tuple[int, int]:
        """(position, node index) of the first ring point strictly after `position`, wrapping."""
        k = bisect.bisect_right(self._positions, position) % len(self._positions)
        return self._positions[k], self._owners[k]

    def choose(self, request: RequestFeatures, state: ClusterState) -> int:
        return self.successor(ring_position(request.user_id))[1]


class PrefixAware(RoutingPolicy):
    """SIMULATION: the node whose cache holds the longest prefix of the prompt (ties: least
    loaded); no cached prefix: least loaded. The cache state is what nodes report (KV events)."""

    name = "prefix_aware"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, request: RequestFeatures, state: ClusterState) -> int:
        matches = [state.match(i, request.prompt) for i in range(len(state.nodes))]
        best = max(matches)
        candidates = [i for i, m in enumerate(matches) if m == best] if best else range(len(state.nodes))
        return _least_loaded(self._rng, state, candidates)


class PriorityClass(RoutingPolicy):
    """SIMULATION: premium users go to the premium pool (capacity-weighted random within it),
    everyone else capacity-weighted random over all nodes. `pool` is public so the attacker's
    nodes can join it."""

    name = "priority_class"

    def __init__(self, rng: random.Random, pool: Iterable[int]) -> None:
        self._rng = rng
        self.pool = sorted(set(pool))

    def choose(self, request: RequestFeatures, state: ClusterState) -> int:
        indices = self.pool if request.user_class == PREMIUM else range(len(state.nodes))
        return weighted_pick(self._rng, state.nodes, indices)
