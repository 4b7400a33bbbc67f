"""SIMULATED routers under attack: traffic, attacker strategies and the round loop.

Each round: finished requests leave; then, in random order, the attacker's requests for the
round (flood), honest background requests and (after a warm-up) one request of the target user
arrive and are routed by the policy and admitted. Every user uses one of a few public apps,
whose system prompts everyone knows. The target is a premium user; each trial it is a fresh
user (id known to the attacker) of a random app, so P(target in T) averages over where each
app's prompt happens to be cached. Nothing here is the real gateway: that is
targeting_gateway.py.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import asdict, dataclass, replace

from traceless_tools.audit.targeting_estimate import Estimate, Scenario
from traceless_tools.audit.targeting_policies import (
    PREMIUM,
    STANDARD,
    ClusterState,
    LeastLoaded,
    NodeSpec,
    PrefixAware,
    PriorityClass,
    RequestFeatures,
    RoutingPolicy,
    UserAffinity,
    ring_position,
)


def app_prefix(app: int) -> tuple[str, str]:
    """The public prompt prefix (system prompt, tool definitions) shipped in app number `app`."""
    return (f"app{app}:system-prompt", f"app{app}:tool-definitions")


@dataclass(frozen=True, slots=True)
class Workload:
    background_per_round: int = 2
    mean_duration: int = 8  # rounds an honest request stays in flight (uniform 1 .. 2*mean-1)
    flood_per_round: int = 4
    flood_duration: int = 60  # the attacker asks for long generations
    warmup_rounds: int = 200
    users: int = 1000
    public_apps: int = 8  # user u uses app u % public_apps
    premium_user_every: int = 10


class Traffic:
    def __init__(self, rng: random.Random, workload: Workload) -> None:
        self.rng = rng
        self.workload = workload

    def duration(self) -> int:
        return self.rng.randint(1, 2 * self.workload.mean_duration - 1)

    def background(self) -> RequestFeatures:
        w, rng = self.workload, self.rng
        u = rng.randrange(w.users)
        user_class = PREMIUM if u % w.premium_user_every == 1 else STANDARD
        return RequestFeatures(
            f"user-{u}", app_prefix(u % w.public_apps) + (f"private:{rng.getrandbits(48)}",), user_class
        )

    def target(self) -> RequestFeatures:
        app = self.rng.randrange(self.workload.public_apps)
        return RequestFeatures(
            f"target-{self.rng.getrandbits(64):016x}",
            app_prefix(app) + (f"private:{self.rng.getrandbits(48)}",),
            PREMIUM,
        )

    def flood(self) -> RequestFeatures:
        return RequestFeatures(f"attacker-{self.rng.getrandbits(32)}", (f"flood:{self.rng.getrandbits(48)}",))


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request of this round. Durations in rounds on an honest / an attacker's node; None:
    a random honest-request duration."""

    request: RequestFeatures
    honest_duration: int | None = None
    attacker_duration: int | None = None
    target: bool = False


class SimAttack:
    """No attack; the base of the strategies (hooks the round loop calls)."""

    name = "none"

    def setup(self, policy: RoutingPolicy, state: ClusterState) -> None:
        pass

    def each_round(self, policy: RoutingPolicy, state: ClusterState, traffic: Traffic) -> list[Arrival]:
        """The attacker's requests to route this round."""
        return []

    def before_target(self, target: RequestFeatures, policy: RoutingPolicy, state: ClusterState) -> None:
        pass


class Flood(SimAttack):
    """Long requests that honest nodes serve in full and the attacker's nodes drop at once:
    the honest nodes look busy, so a least-loaded router sends the target to the idle attacker."""

    name = "flood"

    def each_round(self, policy, state, traffic):
        w = traffic.workload
        return [Arrival(traffic.flood(), w.flood_duration, 0) for _ in range(w.flood_per_round)]


class SybilAffinity(SimAttack):
    """The attacker names one of its nodes (as a node operator may) by grinding names until a
    virtual node lands between the target user's hash and its successor on the ring. It stops
    after `budget` names for a target (the tries have a heavy tail: tiny gaps); then that
    target hashes wherever it hashes."""

    name = "sybil"

    def __init__(self, rng: random.Random, budget: int = 4096) -> None:
        self._rng = rng
        self._budget = budget

    def before_target(self, target, policy, state):
        if not isinstance(policy, UserAffinity):
            raise TypeError("the sybil/affinity strategy needs a hash ring")
        h = ring_position(target.user_id)
        succ, _ = policy.successor(h)
        mine = next(i for i, node in enumerate(state.nodes) if node.attacker)
        for _ in range(self._budget):
            name = f"attacker-{self._rng.getrandbits(64):016x}"
            p = ring_position(f"{name}#0")
            if (h < p < succ) if h < succ else (p > h or p < succ):
                state.nodes[mine] = replace(state.nodes[mine], name=name)
                policy.rebuild(state.nodes)
                return


class SeedPrefix(SimAttack):
    """The attacker's nodes compute every public app prefix themselves, from the start and
    every round, and report them as cached (KV events): a prefix-aware router sends the apps'
    users, the target included, to them."""

    name = "seed_prefix"

    def each_round(self, policy, state, traffic):
        for i, node in enumerate(state.nodes):
            if node.attacker:
                for app in range(traffic.workload.public_apps):
                    state.cache(i, app_prefix(app))
        return []


class PremiumPool(SimAttack):
    """The attacker's nodes join the premium pool (it offers premium hardware)."""

    name = "premium_pool"

    def setup(self, policy, state):
        if not isinstance(policy, PriorityClass):
            raise TypeError("the premium-pool strategy needs a priority router")
        policy.pool = sorted(set(policy.pool) | {i for i, n in enumerate(state.nodes) if n.attacker})


# The simulated (policy, strategy) pairs: each router without an attack, and with the one that fits.
SIM_PLAN = (
    ("least_loaded", "none"),
    ("least_loaded", "flood"),
    ("user_affinity", "none"),
    ("user_affinity", "sybil"),
    ("prefix_aware", "none"),
    ("prefix_aware", "seed_prefix"),
    ("priority_class", "none"),
    ("priority_class", "premium_pool"),
)


def make_policy(name: str, rng: random.Random, nodes: list[NodeSpec]) -> RoutingPolicy:
    if name == "least_loaded":
        return LeastLoaded(rng)
    if name == "user_affinity":
        return UserAffinity(nodes)
    if name == "prefix_aware":
        return PrefixAware(rng)
    if name == "priority_class":  # premium hardware: the largest honest node
        honest = [i for i, n in enumerate(nodes) if not n.attacker]
        return PriorityClass(rng, [max(honest, key=lambda i: (nodes[i].capacity, i))])
    raise ValueError(f"unknown simulated policy {name!r}")


def make_attack(name: str, rng: random.Random) -> SimAttack:
    attacks = {"none": SimAttack, "flood": Flood, "seed_prefix": SeedPrefix, "premium_pool": PremiumPool}
    if name == "sybil":
        return SybilAffinity(rng)
    if name not in attacks:
        raise ValueError(f"unknown strategy {name!r}")
    return attacks[name]()


def simulate(policy_name: str, strategy: str, scenario: Scenario, workload: Workload = Workload()) -> Estimate:
    seed = scenario.seed if scenario.seed is not None else secrets.randbits(64)
    rng = random.Random(f"{seed}:{policy_name}:{strategy}")
    nodes = [NodeSpec(f"node{i}", c, i in scenario.attacker_nodes) for i, c in enumerate(scenario.capacities)]
    state = ClusterState(nodes)
    policy = make_policy(policy_name, rng, state.nodes)
    attack = make_attack(strategy, rng)
    traffic = Traffic(rng, workload)
    attack.setup(policy, state)
    landed = [0] * len(nodes)
    for r in range(workload.warmup_rounds + scenario.requests):
        state.advance()
        arrivals = attack.each_round(policy, state, traffic)
        arrivals += [Arrival(traffic.background()) for _ in range(workload.background_per_round)]
        if r >= workload.warmup_rounds:
            arrivals.append(Arrival(traffic.target(), target=True))
        rng.shuffle(arrivals)
        for a in arrivals:
            if a.target:
                attack.before_target(a.request, policy, state)
            i = policy.choose(a.request, state)
            landed[i] += a.target
            on_attacker = state.nodes[i].attacker and a.attacker_duration is not None
            d = a.attacker_duration if on_attacker else a.honest_duration
            state.admit(i, a.request, d if d is not None else traffic.duration())
    # Name by index: the sybil strategy renames the attacker's node during the run.
    return Estimate(
        policy_name,
        strategy,
        True,
        {f"node{i}": c for i, c in enumerate(landed)},
        {f"node{i}": n.capacity for i, n in enumerate(nodes)},
        frozenset(f"node{i}" for i in scenario.attacker_nodes),
        {"workload": asdict(workload)},
    )
