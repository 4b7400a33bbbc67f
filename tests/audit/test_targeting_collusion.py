"""The attacks of colluding hops in `audit targeting`: each row's honest baseline sits at the fair
level, the attack does not beat it against our client, and it does beat it against a client without
the defence the attack targets (so each row can fail)."""

import pytest

from traceless_tools.audit.targeting_collusion import measure_collusion_linking
from traceless_tools.audit.targeting_collusion_routing import measure_collusion_routing
from traceless_tools.audit.targeting_estimate import AT, BEATS, Scenario


@pytest.fixture(scope="module")
def routing():
    return {r.strategy: r for r in measure_collusion_routing(Scenario(seed=3), 400)}


@pytest.fixture(scope="module")
def linking():
    return {r.strategy: r for r in measure_collusion_linking(8, seed=3)}


@pytest.mark.parametrize("strategy", ["node_aliases", "retry_steering"])
def test_routing_attacks_beat_only_the_weakened_client(routing, strategy):
    r = routing[strategy]
    assert r.honest.verdict(r.fair) == AT and r.attacked.verdict(r.fair) != BEATS
    assert r.weakened.verdict(r.fair) == BEATS and r.passed
    assert r.to_json()["weakened"]["interval_99_99"][0] > r.fair


@pytest.mark.parametrize("strategy", ["pairing_tagger", "key_partition", "forced_refill"])
def test_linking_attacks_beat_only_the_weakened_client(linking, strategy):
    r = linking[strategy]
    assert r.honest.verdict(r.fair) == AT and r.attacked.verdict(r.fair) != BEATS
    assert r.weakened.verdict(r.fair) == BEATS and r.passed


def test_the_report_carries_the_rows_and_prints_them(routing, capsys):
    from traceless_tools.audit.targeting import build_report, print_collusion

    report = build_report(Scenario(seed=3), [], [], list(routing.values()))
    assert report["summary"]["collusion_rows_failed"] == []
    print_collusion(report["collusion"])
    out = capsys.readouterr().out
    assert "node_aliases" in out and "retry_steering" in out and "FAILED" not in out
