"""The fault audit: its verdict rules on made-up outcomes, and the real thing on a tiny model
(node killed under load, then `up` itself killed with SIGKILL). Every fault at once is the soak
(`pytest --soak`), several minutes."""
from __future__ import annotations

import pytest

from traceless.audit.fault_load import Outcome
from traceless.audit.faults import FAULTS, FaultConfig, _row, run

NODE_ARGS = ("--dtype", "float32", "--kv-cache-memory", "64MiB")


def _o(start, end, ok=True, status=None, kind="ok"):
    return Outcome(0, False, start, end, ok, status, kind)


def test_the_verdict_needs_documented_failures_a_quiet_settle_and_no_hang():
    cfg = FaultConfig(recover_bound_s=30.0, settle_s=5.0)
    ok = [_o(9.0, 10.5, False, 502, "status"), _o(10.0, 11.0, False, None, "stream_error"), _o(12.0, 13.0)]
    row = _row("node_kill", ok + [_o(20.0, 21.0)], 10.0, 4.0, 30.0, cfg)
    assert row.passed and row.failures == 2 and row.in_flight_failures == 1 and row.recovered_s == 1.0
    assert row.statuses == [502] and row.kinds == ["status", "stream_error"]
    assert not _row("node_kill", ok + [_o(11.0, 12.0, False, 500, "status")], 10.0, 4.0, 30.0, cfg).passed
    assert not _row("node_kill", ok + [_o(11.0, 40.0, False, None, "timeout")], 10.0, 4.0, 60.0, cfg).passed
    assert not _row("node_kill", ok + [_o(26.0, 27.0, False, 503, "status")], 10.0, 4.0, 30.0, cfg).passed  # settle
    assert not _row("node_kill", ok, 10.0, None, 30.0, cfg).passed  # never came back
    with pytest.raises(ValueError):
        FaultConfig(faults=("node_kill", "disk_on_fire"))


@pytest.mark.slow
def test_a_node_killed_under_load_comes_back_and_up_killed_leaves_no_service(tiny_llama_dir):
    report = run(FaultConfig(str(tiny_llama_dir), ("node_kill",), settle_s=5.0, node_args=NODE_ARGS))
    (row,) = report["rows"]
    assert row["passed"], report
    assert row["back_s"] < 60 and row["timeouts"] == 0
    assert report["orphans_after_kill_9"] == 0 and report["leftovers"] == []


@pytest.mark.soak
def test_every_fault_heals_within_its_bound(tiny_llama_dir):
    report = run(FaultConfig(str(tiny_llama_dir), FAULTS, node_args=NODE_ARGS))
    assert report["passed"], report
