"""Non-targetable routing (threats T13 and T14, docs/threat-model.md): measured, not assumed.

The pure chooser is checked for capacity shares, distinctness and health; then the real
gateway endpoint is checked for the same shares while the requests differ in every way a
client controls (query noise, headers, tokens, cookies), per group of clients as well.
"""

import dataclasses
import inspect
import random
import secrets

import httpx
import pytest

from tests.support.cluster_services import RELEASE, FakeNode, StubReleases, running_app
from tests.support.stats import chi_square_p, shares
from traceless.privacy.attestation.policy import AttesterPolicy
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app
from traceless_tools.cluster.routing import NoNodeAvailableError, RoutingEntry, choose_nodes

CAPACITIES = {"n1": 1, "n2": 2, "n3": 3, "n4": 4}
NODES = [RoutingEntry(node_id, "m", capacity, True) for node_id, capacity in CAPACITIES.items()]
P_MIN = 0.001


def test_routing_sees_only_model_nodes_k_and_randomness():
    assert list(inspect.signature(choose_nodes).parameters) == ["model", "nodes", "k", "rng"]
    assert [f.name for f in dataclasses.fields(RoutingEntry)] == ["node_id", "model", "capacity", "healthy"]


def test_k1_frequencies_match_capacity_shares():
    rng = random.Random(1)
    draws = [choose_nodes("m", NODES, 1, rng)[0].node_id for _ in range(5000)]
    assert chi_square_p(shares(draws), CAPACITIES) > P_MIN


def test_the_check_has_power_against_uniform_routing():
    """The same test rejects a router that ignores capacity: it can fail."""
    rng = random.Random(2)
    draws = [rng.choice(list(CAPACITIES)) for _ in range(5000)]
    assert chi_square_p(shares(draws), CAPACITIES) < P_MIN


def test_default_randomness_is_the_os_csprng(monkeypatch):
    made = []

    class Spy(secrets.SystemRandom):
        def __init__(self):
            made.append(self)
            super().__init__()

    monkeypatch.setattr(secrets, "SystemRandom", Spy)
    assert choose_nodes("m", NODES, 1)[0] in NODES
    assert len(made) == 1
    app = create_gateway_app(GatewayConfig(privacy=False), releases=StubReleases(RELEASE))
    assert isinstance(app.state.gateway._rng, Spy)


def test_k_greater_than_one_gives_distinct_nodes_capped_at_the_pool():
    rng = random.Random(3)
    for k in (2, 3, 4):
        for _ in range(300):
            ids = [e.node_id for e in choose_nodes("m", NODES, k, rng)]
            assert len(ids) == k and len(set(ids)) == k
    assert sorted(e.node_id for e in choose_nodes("m", NODES, 10, rng)) == sorted(CAPACITIES)


def test_first_of_k_draws_follows_capacity():
    rng = random.Random(4)
    firsts = [choose_nodes("m", NODES, 3, rng)[0].node_id for _ in range(4000)]
    assert chi_square_p(shares(firsts), CAPACITIES) > P_MIN


def test_unhealthy_and_other_model_nodes_are_never_returned():
    nodes = NODES + [RoutingEntry("sick", "m", 1000, False), RoutingEntry("other", "m2", 1000, True)]
    rng = random.Random(5)
    seen = set()
    for _ in range(2000):
        seen.update(e.node_id for e in choose_nodes("m", nodes, 4, rng))
    assert seen == set(CAPACITIES)
    assert [e.node_id for e in choose_nodes("m2", nodes, 3, rng)] == ["other"]


def test_no_eligible_node_and_bad_k():
    with pytest.raises(NoNodeAvailableError):
        choose_nodes("m", [RoutingEntry("sick", "m", 1, False)], 1)
    with pytest.raises(NoNodeAvailableError):
        choose_nodes("absent", NODES, 1)
    for k in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            choose_nodes("m", NODES, k)
    for capacity in (0, -1, float("inf"), float("nan"), True):
        with pytest.raises(ValueError):
            RoutingEntry("x", "m", capacity, True)


def _register_all(http):
    """Register CAPACITIES over HTTP, each attested by its own key; returns node_id -> name. The
    URLs are never contacted."""
    ids = {}
    for name, capacity in CAPACITIES.items():
        body = FakeNode().registration(f"http://{name}.invalid", capacity=capacity)
        ids[http.post("/pcc/v1/register", json=body).json()["node_id"]] = name
    return ids


def _noisy_request(http, i, group):
    """A /nodes request that differs from every other in everything the client controls."""
    params = {"model": "m", "k": "1", f"noise{i}": secrets.token_hex(8), "pad": "x" * (i % 97)}
    headers = {
        "user-agent": f"{group}-agent/{i}",
        "x-forwarded-for": f"10.{i % 256}.{group == 'A' and 1 or 2}.{i % 7}",
        "authorization": f"PrivateToken token={secrets.token_urlsafe(16 + i % 50)}",
        "cookie": f"session={secrets.token_hex(4 + i % 9)}",
        "accept-language": ["en", "de", "fr", "zh"][i % 4],
    }
    response = http.get("/pcc/v1/nodes", params=params, headers=headers)
    assert response.status_code == 200
    (node,) = response.json()["nodes"]
    return node["node_id"]


def test_gateway_endpoint_draws_by_capacity_whatever_the_request_carries():
    # No health checks during the test (interval 1 h): the node URLs are placeholders.
    app = create_gateway_app(
        GatewayConfig(privacy=False, health_interval_s=3600, attester_policy=AttesterPolicy.DEVELOPMENT),
        rng=random.Random(6),
        releases=StubReleases(RELEASE),
    )
    by_group = {"A": [], "B": []}
    with running_app(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        ids = _register_all(http)
        for i in range(2000):
            group = "A" if i % 3 else "B"  # two kinds of client, interleaved unevenly
            by_group[group].append(ids[_noisy_request(http, i, group)])
    assert chi_square_p(shares(by_group["A"] + by_group["B"]), CAPACITIES) > P_MIN
    for group, draws in by_group.items():
        assert chi_square_p(shares(draws), CAPACITIES) > P_MIN, group
