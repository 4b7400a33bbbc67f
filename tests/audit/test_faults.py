"""The fault audit: its verdict rules on made-up outcomes, and the real thing on a tiny model
(node killed under load, then `up` itself killed with SIGKILL). Every fault at once is the soak
(`pytest --soak`), several minutes."""

from __future__ import annotations

import os

import pytest

from traceless_tools.audit.fault_load import Outcome
from traceless_tools.audit.fault_offload import CONTEXT_TOKENS, SpillCounts, offload_sizing, spill_counts
from traceless_tools.audit.faults import FAULTS, FaultConfig, _row, run

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
    # a gateway's 404 for a node it dropped is the client's to handle (it refetches and resends once)
    assert not _row("gateway_restart", ok + [_o(11.0, 12.0, False, 404, "status")], 10.0, 4.0, 30.0, cfg).passed
    assert not _row("node_kill", ok + [_o(11.0, 40.0, False, None, "timeout")], 10.0, 4.0, 60.0, cfg).passed
    assert not _row("node_kill", ok + [_o(26.0, 27.0, False, 503, "status")], 10.0, 4.0, 30.0, cfg).passed  # settle
    assert not _row("node_kill", ok, 10.0, None, 30.0, cfg).passed  # never came back
    with pytest.raises(ValueError):
        FaultConfig(faults=("node_kill", "disk_on_fire"))


def test_spills_are_counted_from_every_node_event_log(tmp_path):
    (tmp_path / "node0.log").write_text(
        '{"ts":1,"event":"engine.preempted","num_requests":2,"spilled":2}\n'
        "not an event line\n"
        '{"ts":2,"event":"engine.kv_spill_failed","num_requests":1}\n'
    )
    (tmp_path / "node1.log").write_text('{"ts":3,"event":"engine.preempted","num_requests":3,"spilled":1}\n')
    (tmp_path / "gateway.log").write_text('{"ts":4,"event":"engine.preempted","num_requests":9,"spilled":9}\n')
    assert spill_counts(tmp_path) == SpillCounts(3, 1)
    assert spill_counts(tmp_path) - SpillCounts(1, 1) == SpillCounts(2, 0)


def test_offload_nodes_get_a_cache_of_one_full_context(tiny_llama_dir):
    from traceless.model.loader import read_model_config

    per_token = read_model_config(str(tiny_llama_dir)).kv_bytes_per_token * 4  # float32
    sizing = offload_sizing(
        str(tiny_llama_dir), ("--dtype", "float32", "--kv-cache-memory", "64MiB", "--block-size", "4")
    )
    assert sizing.node_args == (
        "--kv-cache-memory",
        str((CONTEXT_TOKENS // 4 + 1) * 4 * per_token),
        "--max-model-len",
        str(CONTEXT_TOKENS),
    )
    assert sizing.tmpfs_bytes >= 8 * CONTEXT_TOKENS * per_token and sizing.tmpfs_bytes % 2**20 == 0


def test_offload_sizing_counts_the_dtype_of_the_cache(monkeypatch):
    """The built-in model is a GGUF file whose blocks the CPU keeps under `auto`: it computes in
    float32 even where the CPU runs bfloat16 and caches KV in float16 (runner/build.py
    cache_dtype), so its cache is sized in float16; a float32 cache asked for, in float32."""
    import traceless.runner.build as build
    from traceless.model.loader import read_model_config

    monkeypatch.setattr(build, "cpu_runs_bf16", lambda: True)
    per_token = read_model_config(None).kv_bytes_per_token * 2  # float16
    sizing = offload_sizing(None, ("--device", "cpu", "--block-size", "4"))
    assert sizing.node_args[1] == str((CONTEXT_TOKENS // 4 + 1) * 4 * per_token)
    sizing = offload_sizing(None, ("--device", "cpu", "--block-size", "4", "--kv-cache-dtype", "float32"))
    assert sizing.node_args[1] == str((CONTEXT_TOKENS // 4 + 1) * 4 * per_token * 2)


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


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="the offload directory is a tmpfs: mounting one needs root")
def test_a_full_offload_directory_after_the_nodes_spilled_heals(tiny_llama_dir):
    report = run(FaultConfig(str(tiny_llama_dir), ("offload_full",), settle_s=5.0, node_args=NODE_ARGS))
    (row,) = report["rows"]
    assert row["passed"] and row["spilled"] > 0, report
    assert report["orphans_after_kill_9"] == 0 and report["leftovers"] == []
