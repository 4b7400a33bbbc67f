"""The amplification rows of `audit targeting`: an anonymous nonce-bound listing costs nodes nothing,
a paid one a signature each and no evidence collection, and the design before (no token, evidence per
document) shows the attack: one collection per node per anonymous request."""

import pytest

from traceless_tools.audit.amplification import measure_amplification, measure_row


@pytest.fixture(scope="module")
def rows():
    return {r.strategy: r for r in measure_amplification(nodes=2, listings=5)}


def test_anonymous_listings_cost_nodes_nothing_and_paid_ones_no_evidence(rows):
    assert rows["anonymous"].statuses == (401,)
    assert (rows["anonymous"].signed, rows["anonymous"].collections) == (0, 0)
    assert (rows["honest"].signed, rows["honest"].collections) == (10, 0)


def test_the_weakened_design_shows_the_attack(rows):
    weakened = rows["weakened"]
    assert weakened.collections == 10 and weakened.collections_per_request_node == 1.0
    assert all(r.passed for r in rows.values())


def test_the_report_carries_the_rows_and_prints_them(rows, capsys):
    from traceless_tools.audit.targeting import build_report, print_amplification
    from traceless_tools.audit.targeting_estimate import Scenario

    report = build_report(Scenario(seed=3), [], [], [], list(rows.values()))
    assert report["summary"]["amplification_rows_failed"] == []
    print_amplification(report["amplification"])
    out = capsys.readouterr().out
    assert "anonymous" in out and "weakened" in out and "FAILED" not in out


def test_an_unknown_row_is_refused():
    with pytest.raises(ValueError):
        measure_row("stampede")
