import random

from traceless_tools.client.routing_watch import RoutingWatch


def answered(rng, caps):
    ids = list(caps)
    return rng.choices(ids, weights=[caps[i] for i in ids])[0]


def test_fair_routing_raises_no_warning():
    rng, watch = random.Random(0), RoutingWatch()
    caps = {"a": 1, "b": 2, "c": 3, "d": 4}
    assert [w for _ in range(2000) if (w := watch.observe(answered(rng, caps), caps))] == []


def test_a_node_answering_far_beyond_its_attested_share_is_flagged():
    rng, watch = random.Random(1), RoutingWatch()
    caps = {"a": 1, "b": 1, "c": 1, "evil": 1}
    warnings = []
    for i in range(400):
        node = answered(rng, caps)
        if i % 2 == 0:  # requests to the others fail every other time: only "evil" answers
            node = "evil"
        if w := watch.observe(node, caps):
            warnings.append(w)
    assert len(warnings) == 1 and "concentrated" in warnings[0] and "attested" in warnings[0]


def test_a_node_that_dies_raises_no_warning():
    """Plain faults, no attacker: node "a" (3/4 of the capacity) dies after 40 requests and later rounds
    list only "b", which then answers everything, as it should. Judged against the round each request
    was drawn from, nothing is concentrated."""
    rng, watch = random.Random(2), RoutingWatch()
    both, alone = {"a": 3, "b": 1}, {"b": 1}
    warnings = [
        w
        for i in range(400)
        if (w := watch.observe(answered(rng, both if i < 40 else alone), both if i < 40 else alone))
    ]
    assert warnings == [] and not watch.concentrated


def test_the_status_counts_without_naming_nodes():
    watch = RoutingWatch()
    for _ in range(40):
        watch.observe("evil", {"evil": 1, "honest": 9})
    status = watch.status()
    assert status == {"answered": 40, "concentrated": True, "nodes_flagged": 1} and "evil" not in str(status)
