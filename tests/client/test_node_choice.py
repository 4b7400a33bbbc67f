"""The client draws its node itself, by attested capacity (threat T14, docs/threat-model.md: the client used to
take the gateway's order)."""

import random

import pytest

from tests.support.stats import chi_square_p
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless_tools.client.node_choice import draw_node
from traceless_tools.client.node_verifier import VerifiedNode

KEY = OhttpServer().key_config


def _node(name, capacity):
    return VerifiedNode(name, capacity, KEY, b"\x00" * 32, "kid-" + name, 0.0)


def test_draws_follow_attested_capacities_whatever_the_gateways_order():
    nodes = [_node("a", 1), _node("b", 2), _node("c", 5)]
    rng = random.Random(7)
    counts = {"a": 0, "b": 0, "c": 0}
    for i in range(8000):
        offered = nodes if i % 2 else list(reversed(nodes))  # the gateway's order must not matter
        counts[draw_node(offered, rng).node_id] += 1
    p = chi_square_p(counts, {"a": 1, "b": 2, "c": 5})
    assert p > 1e-3, counts
    assert counts["c"] > counts["b"] > counts["a"]


def test_no_nodes_is_an_error():
    with pytest.raises(LookupError):
        draw_node([], random.Random(0))
