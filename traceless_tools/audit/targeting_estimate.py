"""One measurement of `traceless audit targeting`: where N target requests landed, against the
attacker's capacity share (threat T13, docs/threat-model.md: P(u in R(T)) must equal sum C(T) / sum C(S))."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from traceless_tools.audit.stats import chi_square_p, wilson_interval

BEATS = "BEATS its share"
BELOW = "below its share"
AT = "at its share"
VERDICT_Z = 3.89  # two-sided 99.99% (see Estimate.verdict_ci)


@dataclass(frozen=True, slots=True)
class Scenario:
    """The cluster and the experiment, shared by every policy and strategy."""

    capacities: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0)
    attacker_nodes: frozenset[int] = frozenset({0, 1})
    requests: int = 2000  # target requests per policy x strategy
    seed: int | None = None  # None: fresh randomness; the gateway keeps its own CSPRNG

    def __post_init__(self) -> None:
        if len(self.capacities) < 2 or not all(math.isfinite(c) and c > 0 for c in self.capacities):
            raise ValueError("need at least two nodes with positive finite capacities")
        if not self.attacker_nodes or not self.attacker_nodes < set(range(len(self.capacities))):
            raise ValueError("the attacker must hold some, but not all, of the nodes (indices into capacities)")
        if self.requests < 1:
            raise ValueError("requests must be positive")


@dataclass(frozen=True, slots=True)
class Estimate:
    """Landing counts of the target's requests. `landed` and `capacity` are per node name
    (nodes the attacker registered during the run included); `attacker` names T."""

    policy: str
    strategy: str
    simulated: bool
    landed: dict[str, int]
    capacity: dict[str, float]
    attacker: frozenset[str]
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return sum(self.landed.values())

    @property
    def hits(self) -> int:
        return sum(count for name, count in self.landed.items() if name in self.attacker)

    @property
    def share(self) -> float:
        """sum C(T) / sum C(S), T including whatever the attacker registered."""
        total = math.fsum(self.capacity.values())
        return math.fsum(c for name, c in self.capacity.items() if name in self.attacker) / total

    @property
    def p_hat(self) -> float:
        return self.hits / self.n

    @property
    def ci(self) -> tuple[float, float]:
        return wilson_interval(self.hits, self.n)

    @property
    def advantage(self) -> float:
        """P(target in T) / capacity share: 1 is what the definition allows."""
        return self.p_hat / self.share

    @property
    def verdict_ci(self) -> tuple[float, float]:
        """The interval the verdict reads: 99.99% per row, so that over the dozen rows of one run an
        honest router is called BEATS less than once in a thousand runs (a 95% interval per row would
        misjudge some row of an honest run about every second run)."""
        return wilson_interval(self.hits, self.n, z=VERDICT_Z)

    @property
    def verdict(self) -> str:
        lo, hi = self.verdict_ci
        return BEATS if lo > self.share else BELOW if hi < self.share else AT

    @property
    def chi_square_p(self) -> float:
        """Goodness of fit of the per-node landing counts to the capacity shares."""
        names = sorted(self.capacity)
        total = math.fsum(self.capacity.values())
        return chi_square_p(
            [self.landed.get(name, 0) for name in names], [self.capacity[name] / total for name in names]
        )

    def to_json(self) -> dict:
        lo, hi = self.ci
        return {
            "policy": self.policy,
            "strategy": self.strategy,
            "simulated": self.simulated,
            "requests": self.n,
            "hits": self.hits,
            "attacker_capacity_share": self.share,
            "p_target_in_T": self.p_hat,
            "p_95ci": [lo, hi],
            "p_verdict_ci": list(self.verdict_ci),
            "advantage": self.advantage,
            "verdict": self.verdict,
            "chi_square_p_capacity_fit": self.chi_square_p,
            "landed": dict(sorted(self.landed.items())),
            "capacity": dict(sorted(self.capacity.items())),
            "attacker_nodes": sorted(self.attacker),
            "notes": self.notes,
        }
