import random

from traceless.client.routing_watch import RoutingWatch


def offered(rng, caps):
    ids = list(caps)
    first = rng.choices(ids, weights=[caps[i] for i in ids])[0]
    return {"node_id": first, "capacity": caps[first]}, [{"node_id": i, "capacity": c} for i, c in caps.items()]


def test_fair_routing_raises_no_warning():
    rng, watch = random.Random(0), RoutingWatch()
    caps = {"a": 1, "b": 2, "c": 3, "d": 4}
    assert [w for _ in range(2000) if (w := watch.observe(*offered(rng, caps)))] == []


def test_a_node_offered_far_beyond_its_share_is_flagged():
    rng, watch = random.Random(1), RoutingWatch()
    caps = {"a": 1, "b": 1, "c": 1, "evil": 1}
    warnings = []
    for i in range(400):
        first, all_ = offered(rng, caps)
        if i % 2 == 0:  # a steering gateway sends every other request to "evil"
            first = {"node_id": "evil", "capacity": 1}
        if w := watch.observe(first, all_):
            warnings.append(w)
    assert len(warnings) == 1 and "concentrated" in warnings[0]
