"""The restart rule of `traceless up`'s supervisor, on stand-in processes and a given clock."""

from __future__ import annotations

import pytest

from traceless_tools.local.supervisor import GaveUp, RestartPolicy, Supervisor


class Proc:
    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode


def test_a_stopped_service_restarts_after_a_growing_backoff_and_a_stable_run_resets_it():
    started: list[Proc] = []

    def start(name):
        started.append(Proc())
        return started[-1]

    sup = Supervisor(start, RestartPolicy(backoff_s=(1.0, 2.0, 4.0), stable_s=60.0, max_failures=3))
    node, other = Proc(), Proc()
    sup.watch("node0", node, 0.0)
    sup.watch("gateway", other, 0.0)
    assert sup.poll(10.0) == []
    node.returncode = -9
    assert sup.poll(10.0) == [("node0", "stopped (exit status -9); restarting in 1s")]
    assert sup.poll(10.5) == [] and not started  # waiting out its backoff; the others untouched
    assert sup.poll(11.0) == [("node0", "restarted")] and len(started) == 1
    started[-1].returncode = 70  # stopped again soon after it started: the next delay is longer
    assert "restarting in 2s" in sup.poll(12.0)[0][1]
    assert sup.poll(14.0) == [("node0", "restarted")]
    started[-1].returncode = 70
    assert sup.poll(200.0)[0][1].endswith("restarting in 1s")  # it had run 186 s: a fresh count
    assert other.poll() is None


def test_a_service_that_keeps_failing_at_once_ends_the_deployment():
    sup = Supervisor(lambda name: failing, RestartPolicy(backoff_s=(0.0,), stable_s=60.0, max_failures=2))
    failing = Proc()
    failing.returncode = 1
    sup.watch("node0", failing, 0.0)
    sup.poll(1.0)
    sup.poll(1.0)  # restarted (the stand-in is still failed)
    sup.poll(2.0)
    sup.poll(2.0)
    with pytest.raises(GaveUp, match="node0 keeps stopping"):
        sup.poll(3.0)
