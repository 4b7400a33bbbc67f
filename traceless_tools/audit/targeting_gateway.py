"""Our routing (`capacity_random`) measured on the REAL gateway, under every attacker strategy.

Per strategy: a fresh `create_gateway_app` (privacy off: no token check, so the attacker's
volume is not limited by tokens; DEVELOPMENT attester policy) and the audit's nodes
(targeting_nodes.py), each on a loopback uvicorn server. Every node registers through
`POST /pcc/v1/register` with a real OHTTP key configuration and a signed attestation of its
capacity and URL. Each target request is what the real client does: candidates with a fresh
nonce (`GET /pcc/v1/nodes?model=M&k=1000&nonce=N`, again every `refresh_every` requests, as the
client's maximum attestation age), each verified by the client's NodeVerifier (the attester keys of
every node the farm made are trusted: the attacker's nodes are real, attested machines), then the
client's own capacity-weighted draw (node_choice.draw_node). The client sends no user id, prompt
or class: nothing has an input for them, which is the property under test.

Strategies, applied through the gateway's own interfaces:
  flood         worker threads send OHTTP requests to the honest nodes through the gateway for
                the whole measurement; the honest nodes hold each one (real load), the
                attacker's stay idle: a least-loaded router would now pick the attacker.
  sybil         the attacker registers extra nodes (the gateway, not the node, picks node ids,
                so no ring position can be chosen); T's share includes what it registered.
  seed_prefix   before the targets, and every `seed_every` of them, the attacker sends the
                target's app prompt to its own nodes through the gateway (warming their caches).
  premium_pool  the attacker registers its nodes again with a `"pool": "premium"` field.
  capacity_inflation  the attacker's nodes re-register claiming capacity 10^6 (signed by their own
                keys; no logged release allows it) and the maximum the release allows.
  sybil_urls    each attacker node registers again under `sybil_nodes` more URLs, same key.
  reregistration_hijack  the attacker registers its key at every honest node's URL, and replays
                each honest node's earlier registration document.
  health_manipulation  health checks every 0.2 s; the attacker squats honest URLs with its keys
                (so a check there finds another key), floods the honest nodes through the
                gateway, and its own nodes answer every check at once.
  stale_attestation  a gateway that replays, in place of each attacker node's fresh document, one
                captured earlier (another nonce): the row's success rate is replays accepted.
"""

from __future__ import annotations

import base64
import json
import random
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

from traceless.http.serve import serve_in_thread
from traceless.privacy.attestation.policy import AttesterPolicy
from traceless.privacy.ohttp.call import encapsulate_call
from traceless.privacy.ohttp.keys import decode_ohttp_keys
from traceless_tools.audit.targeting_estimate import Estimate, Scenario
from traceless_tools.audit.targeting_nodes import MAX_AUDIT_CAPACITY, AuditNode, AuditReleases, NodeFarm
from traceless_tools.audit.targeting_policies import PREMIUM, ClusterState, NodeSpec, RequestFeatures, RoutingPolicy
from traceless_tools.audit.targeting_sim import app_prefix
from traceless_tools.client.node_choice import draw_node
from traceless_tools.client.node_verifier import NodeVerifier, VerifiedNode
from traceless_tools.client.private_client import ClientConfig
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app

MODEL = "traceless-audit-model"
GATEWAY_STRATEGIES = (
    "none",
    "flood",
    "sybil",
    "seed_prefix",
    "premium_pool",
    "capacity_inflation",
    "sybil_urls",
    "reregistration_hijack",
    "health_manipulation",
    "stale_attestation",
)


@dataclass(frozen=True, slots=True)
class GatewayAttackConfig:
    flood_workers: int = 8  # concurrent flood requests kept in flight
    hold_s: float = 0.05  # how long an honest node works on one request
    sybil_nodes: int = 8
    sybil_capacity: int = 1
    seed_every: int = 100
    refresh_every: int = 25  # target requests per fresh candidate list (the client's maximum age)


class GatewayRouting(RoutingPolicy):
    """OURS: the real client's selection (fresh candidates, verification, its own capacity-weighted
    draw) over the real gateway, over HTTP."""

    name = "capacity_random"
    simulated = False

    def __init__(self, run: GatewayRun, refresh_every: int) -> None:
        self._run = run
        self._refresh_every = refresh_every
        self._verified: list[VerifiedNode] = []
        self._since_refresh = refresh_every
        cfg = ClientConfig(
            "http://unused",
            "unused",
            "http://unused",
            "http://127.0.0.1:9",
            bytes(32),
            tuple(node.attester_key for node in run.farm.nodes.values()),
            MODEL,
            attester_policy=AttesterPolicy.DEVELOPMENT,
        )
        self._verifier = NodeVerifier(cfg, releases=AuditReleases())
        self.refused = 0

    def close(self) -> None:
        self._verifier.close()

    def choose(self, request: RequestFeatures, state: ClusterState) -> int:
        # `request` and `state` are deliberately not sent: the candidate request carries only the
        # model, k and the client's nonce, and the draw reads only attested capacities.
        if self._since_refresh >= self._refresh_every:
            nonce = secrets.token_bytes(32)
            response = self._run.http.get("/pcc/v1/nodes", params={"model": MODEL, "k": "1000", "nonce": nonce.hex()})
            response.raise_for_status()
            offered = self._run.tamper(response.json()["nodes"])
            self._verified = self._verifier.verify_all(offered, nonce)
            self.refused += len(offered) - len(self._verified)
            self._since_refresh = 0
        self._since_refresh += 1
        return self._run.index_of[draw_node(self._verified, self._run.rng).node_id]


@dataclass
class GatewayRun:
    """One live gateway with its nodes; what the attacker's strategies act through."""

    http: httpx.Client
    farm: NodeFarm
    farm_url: str
    rng: random.Random
    state: ClusterState = field(default_factory=lambda: ClusterState([]))
    index_of: dict[str, int] = field(default_factory=dict)
    notes: dict[str, object] = field(default_factory=dict)
    stale: dict[str, str] = field(default_factory=dict)  # node_id -> a captured old document to replay

    def register(self, node: AuditNode) -> str:
        response = self.http.post("/pcc/v1/register", json=node.registration(MODEL))
        response.raise_for_status()
        node_id = response.json()["node_id"]
        self.index_of[node_id] = len(self.state.nodes)
        self.state.nodes.append(NodeSpec(node.name, node.capacity, node.attacker))
        return node_id

    def tamper(self, offered: list[dict]) -> list[dict]:
        """What a replaying gateway hands the client: captured documents in place of fresh ones."""
        return [
            {**entry, "attestation": self.stale[entry["node_id"]]} if entry["node_id"] in self.stale else entry
            for entry in offered
        ]

    def count(self, key: str, status: int) -> None:
        statuses = self.notes.setdefault(key, {})
        assert isinstance(statuses, dict)
        statuses[str(status)] = statuses.get(str(status), 0) + 1

    def listing(self, attacker: bool) -> list[dict]:
        """The gateway's public node list (k = all), split by who the attacker knows it owns."""
        nodes = self.http.get("/pcc/v1/nodes", params={"model": MODEL, "k": "1000"}).json()["nodes"]
        return [
            n
            for n in nodes
            if n["node_id"] in self.index_of and self.state.nodes[self.index_of[n["node_id"]]].attacker == attacker
        ]


def send_ohttp(http: httpx.Client, entry: dict, messages: list[dict], max_tokens: int) -> int:
    """POST an encapsulated chat request to one listed node through the gateway; the status."""
    (config, *_) = decode_ohttp_keys(base64.b64decode(entry["ohttp_keys"]))
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens}).encode()
    call = encapsulate_call(config, b"/v1/chat/completions", body, stream=False)
    response = http.post(
        f"/pcc/v1/ohttp/{entry['node_id']}", content=call.body, headers={"content-type": call.media_type}
    )
    return response.status_code


class GatewayAttack:
    """No attack; the base of the strategies."""

    name = "none"

    def __init__(self, cfg: GatewayAttackConfig) -> None:
        self.cfg = cfg

    def setup(self, run: GatewayRun) -> None:
        pass

    @contextmanager
    def running(self, run: GatewayRun) -> Iterator[None]:
        yield

    def before_target(self, run: GatewayRun, k: int) -> None:
        pass


class Flood(GatewayAttack):
    name = "flood"

    def __init__(self, cfg: GatewayAttackConfig) -> None:
        super().__init__(cfg)
        self._samples: list[int] = []  # honest nodes' requests in flight at each target request

    @contextmanager
    def running(self, run: GatewayRun) -> Iterator[None]:
        honest = run.listing(attacker=False)
        stop, lock = threading.Event(), threading.Lock()
        statuses: Counter = Counter()
        errors: list[BaseException] = []
        base_url = str(run.http.base_url)

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            try:
                with httpx.Client(base_url=base_url, timeout=30) as http:
                    while not stop.is_set():
                        status = send_ohttp(
                            http, rng.choice(honest), [{"role": "user", "content": "write a very long story"}], 4096
                        )
                        with lock:
                            statuses[status] += 1
            except BaseException as exc:  # re-raised in the measuring thread below
                errors.append(exc)

        threads = [
            threading.Thread(target=worker, args=(run.rng.getrandbits(64),), daemon=True)
            for _ in range(self.cfg.flood_workers)
        ]
        for t in threads:
            t.start()
        try:
            yield
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        if errors:
            raise RuntimeError("a flood worker failed") from errors[0]
        run.notes.update(
            flood_status_counts={str(k): v for k, v in statuses.items()},
            flood_forwarded_to_honest=run.farm.served(attacker=False),
            honest_inflight_mean_at_target=sum(self._samples) / max(1, len(self._samples)),
            attacker_served=run.farm.served(attacker=True),
        )

    def before_target(self, run, k):
        self._samples.append(run.farm.inflight(attacker=False))


class Sybil(GatewayAttack):
    name = "sybil"

    def setup(self, run):
        for j in range(self.cfg.sybil_nodes):
            run.register(run.farm.add(f"sybil{j}", self.cfg.sybil_capacity, attacker=True))
        run.notes["sybil_nodes_registered"] = self.cfg.sybil_nodes


class SeedPrefix(GatewayAttack):
    name = "seed_prefix"

    def before_target(self, run, k):
        if k % self.cfg.seed_every:
            return
        seed = [{"role": "system", "content": " ".join(app_prefix(0))}, {"role": "user", "content": "hi"}]
        for entry in run.listing(attacker=True):
            status = send_ohttp(run.http, entry, seed, 1)
            key = f"seed_status_{status}"
            run.notes[key] = run.notes.get(key, 0) + 1


class PremiumPool(GatewayAttack):
    name = "premium_pool"

    def setup(self, run):
        statuses: Counter[int] = Counter()
        for node in list(run.farm.nodes.values()):
            if node.attacker:
                body = {**node.registration(MODEL), "pool": PREMIUM}
                statuses[run.http.post("/pcc/v1/register", json=body).status_code] += 1
        run.notes["premium_registration_statuses"] = {str(k): v for k, v in statuses.items()}


def _attackers(run: GatewayRun) -> list[AuditNode]:
    return [node for node in list(run.farm.nodes.values()) if node.attacker]


class CapacityInflation(GatewayAttack):
    name = "capacity_inflation"

    def setup(self, run):
        for node in _attackers(run):
            for claim in (10**6, MAX_AUDIT_CAPACITY + 1):
                response = run.http.post("/pcc/v1/register", json=node.registration(MODEL, capacity=claim))
                run.count("inflated_registration_statuses", response.status_code)


class SybilUrls(GatewayAttack):
    name = "sybil_urls"

    def setup(self, run):
        for node in _attackers(run):
            for j in range(self.cfg.sybil_nodes):
                response = run.http.post("/pcc/v1/register", json=node.registration(MODEL, url=f"{node.url}-alias{j}"))
                run.count("alias_registration_statuses", response.status_code)
            run.http.post("/pcc/v1/register", json=node.registration(MODEL))  # and back where it serves


class ReregistrationHijack(GatewayAttack):
    name = "reregistration_hijack"

    def setup(self, run):
        attackers = _attackers(run)
        for honest in [n for n in list(run.farm.nodes.values()) if not n.attacker]:
            earlier = honest.registration(MODEL)  # a document the attacker captured on the wire
            earlier["attestation"] = honest.document(secrets.token_bytes(16), now=time.time() - 60)
            run.count("replayed_registration_statuses", run.http.post("/pcc/v1/register", json=earlier).status_code)
            squatter = attackers[0]
            run.count(
                "squat_registration_statuses",
                run.http.post("/pcc/v1/register", json=squatter.registration(MODEL, url=honest.url)).status_code,
            )
            run.http.post("/pcc/v1/register", json=squatter.registration(MODEL))


class HealthManipulation(Flood):
    name = "health_manipulation"

    def setup(self, run):
        ReregistrationHijack(self.cfg).setup(run)  # squat records at honest URLs: checks there find other keys

    def before_target(self, run, k):
        super().before_target(run, k)
        if k % 50 == 0:
            time.sleep(0.25)  # let a health round run between target requests


class StaleAttestation(GatewayAttack):
    name = "stale_attestation"

    def setup(self, run):
        for node_id, index in run.index_of.items():
            if run.state.nodes[index].attacker:
                node = run.farm.nodes[run.state.nodes[index].name]
                run.stale[node_id] = node.document(secrets.token_bytes(16), ttl_s=3600)


def make_gateway_attack(name: str, cfg: GatewayAttackConfig) -> GatewayAttack:
    for cls in (
        GatewayAttack,
        Flood,
        Sybil,
        SeedPrefix,
        PremiumPool,
        CapacityInflation,
        SybilUrls,
        ReregistrationHijack,
        HealthManipulation,
        StaleAttestation,
    ):
        if cls.name == name:
            return cls(cfg)
    raise ValueError(f"unknown strategy {name!r}")


def measure_gateway(strategy: str, scenario: Scenario, cfg: GatewayAttackConfig = GatewayAttackConfig()) -> Estimate:
    """Register the cluster on a fresh real gateway, run `strategy`, ask for N target routes."""
    seeded = scenario.seed is not None
    gateway_rng = random.Random(f"{scenario.seed}:gateway:{strategy}") if seeded else None  # None: CSPRNG
    rng = random.Random(f"{scenario.seed}:attacker:{strategy}" if seeded else secrets.randbits(64))
    attack = make_gateway_attack(strategy, cfg)
    farm = NodeFarm(cfg.hold_s)
    health_s = 0.2 if strategy == "health_manipulation" else 3600
    app = create_gateway_app(
        GatewayConfig(
            privacy=False, health_interval_s=health_s, health_timeout_s=2.0, attester_policy=AttesterPolicy.DEVELOPMENT
        ),
        rng=gateway_rng,
        releases=AuditReleases(),
    )
    with (
        serve_in_thread(farm.app) as farm_url,
        serve_in_thread(app) as gateway_url,
        httpx.Client(base_url=gateway_url, timeout=30) as http,
    ):
        farm.url = farm_url
        run = GatewayRun(http, farm, farm_url, rng)
        for i, capacity in enumerate(scenario.capacities):
            run.register(farm.add(f"node{i}", int(capacity), i in scenario.attacker_nodes))
        attack.setup(run)
        policy = GatewayRouting(run, cfg.refresh_every)
        target = RequestFeatures("target-user", app_prefix(0) + ("private:question",), PREMIUM)  # never sent
        landed = Counter({node.name: 0 for node in run.state.nodes})
        try:
            with attack.running(run):
                for k in range(scenario.requests):
                    attack.before_target(run, k)
                    landed[run.state.nodes[policy.choose(target, run.state)].name] += 1
        finally:
            policy.close()
        registry = app.state.gateway.registry
        registry.check_integrity()
        run.notes.update(
            registered_nodes=len(registry),
            gateway_rng="seeded" if seeded else "SystemRandom",
            client_refused_candidates=policy.refused,
        )
    nodes = run.state.nodes
    return Estimate(
        GatewayRouting.name,
        strategy,
        False,
        dict(landed),
        {n.name: n.capacity for n in nodes},
        frozenset(n.name for n in nodes if n.attacker),
        run.notes,
    )
