"""Fault audit (`traceless audit faults`): the private path under steady load while one component
at a time fails, and what users saw.

A real `traceless up` (two nodes, its supervisor, the gateway checking health every second) serves
8 workers of the official openai client through the proxy, every other one streaming. One fault at
a time: a node killed (`kill -9`) or stalled (SIGSTOP for `stall_s`, then SIGCONT), the gateway,
the issuer or the relay killed (`up` starts it again); then, in a deployment of its own whose
nodes' KV cache is small enough that the load preempts and spills, their offload directory filled
(a tmpfs; needs root; the row fails unless the nodes spilled, counted from their events).

For each: the requests that failed, with which status, how many were in flight when the fault
came, when the component was back (`back_s`) and when the last request failed (`recovered_s`). A
fault passes when no request hung (client timeout), every failure had a documented status
(DOCUMENTED_STATUSES, or an error event in a stream), the component was back and the last failure
over within `recover_bound_s`, and no request started in the last `settle_s` of its window failed.
A fault is not injected into a request on purpose: "in flight" counts the failed requests that had
started before the fault (most of a worker's time may be spent waiting for a token, not at a
node). At the end of each deployment `up` itself is killed with SIGKILL: every service must stop
(parent-death signal), and no file of the deployment holds the prompt or a spill file.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from traceless_tools.audit.fault_load import PROMPT, Load, Outcome
from traceless_tools.audit.fault_offload import LOAD_MAX_TOKENS
from traceless_tools.audit.fault_up import UpUnderTest
from traceless_tools.report.output import finish

FAULTS = ("node_kill", "node_stop", "gateway_restart", "relay_restart", "offload_full", "issuer_restart")
QUICK_FAULTS = ("node_kill",)
# What a request may fail with while a component is down (docs/faults.md): 502 (a hop or the node
# failed after the request left), 503 (no healthy node, relay unreachable, no token, engine
# restarting), 504 (the path went silent past the client's timeouts). A gateway's 404 for a node it
# no longer lists never reaches the user: the client fetches the list again and resends once, to
# the same node only, or fails with 503 no_healthy_node.
DOCUMENTED_STATUSES = frozenset({502, 503, 504})


@dataclass(frozen=True, slots=True)
class FaultConfig:
    model: str | None = None  # the nodes' --model (None: the default model)
    faults: tuple[str, ...] = FAULTS
    workers: int = 8
    max_tokens: int = 12
    stall_s: float = 20.0
    recover_bound_s: float = 90.0
    settle_s: float = 8.0
    node_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(FAULTS)
        if unknown or not self.faults:
            raise ValueError(f"faults must be some of {', '.join(FAULTS)}")
        if self.workers < 1 or self.stall_s <= 0 or self.recover_bound_s <= 0 or self.settle_s <= 0:
            raise ValueError("workers >= 1 and positive stall, bound and settle times")


@dataclass(frozen=True, slots=True)
class FaultRow:
    fault: str
    requests: int
    failures: int
    in_flight_failures: int  # failed requests that had started before the fault
    statuses: list[int]
    kinds: list[str]
    timeouts: int
    settle_failures: int
    back_s: float | None  # the component serving again (None: not within the bound)
    recovered_s: float  # from the fault to the end of the last failed request (0: none failed)
    passed: bool
    note: str = ""
    spilled: int | None = None  # offload_full: preempted requests whose KV the nodes sealed and spilled
    spill_failures: int | None = None  # offload_full: those that could not be spilled (the directory full)


def _row(
    fault: str,
    seen: list[Outcome],
    t0: float,
    back_s: float | None,
    window_end: float,
    cfg: FaultConfig,
    note: str = "",
) -> FaultRow:
    failed = [o for o in seen if not o.ok]
    statuses = sorted({o.status for o in failed if o.status is not None})
    settle = [o for o in failed if o.start >= window_end - cfg.settle_s]
    recovered = max((o.end - t0 for o in failed), default=0.0)
    timeouts = sum(o.kind == "timeout" for o in failed)
    passed = (
        back_s is not None
        and timeouts == 0
        and not settle
        and recovered <= cfg.recover_bound_s
        and set(statuses) <= DOCUMENTED_STATUSES
        and all(o.kind in ("status", "stream_error") for o in failed)
    )
    return FaultRow(
        fault,
        len(seen),
        len(failed),
        sum(o.start < t0 for o in failed),
        statuses,
        sorted({o.kind for o in failed}),
        timeouts,
        len(settle),
        back_s,
        round(recovered, 1),
        passed,
        note,
    )


def run_fault(fault: str, up: UpUnderTest, load: Load, cfg: FaultConfig) -> FaultRow:
    """Inject one fault under the running load; watch until the component is back, then settle."""
    time.sleep(3.0)  # steady load before the fault
    t0 = time.monotonic()
    spills_before = up.spill_counts()
    inject: dict[str, Callable[[], bool]] = {
        "node_kill": lambda: up.kill_and_wait("node0", signal.SIGKILL, cfg.recover_bound_s),
        "node_stop": lambda: up.stall_and_wait("node0", cfg.stall_s, cfg.recover_bound_s),
        "gateway_restart": lambda: up.kill_and_wait("gateway", signal.SIGKILL, cfg.recover_bound_s),
        "issuer_restart": lambda: up.kill_and_wait("issuer", signal.SIGKILL, cfg.recover_bound_s),
        "relay_restart": lambda: up.kill_and_wait("relay", signal.SIGKILL, cfg.recover_bound_s),
        "offload_full": lambda: up.fill_offload(10.0),
    }
    back = inject[fault]()
    back_s = round(time.monotonic() - t0, 1) if back else None
    # Watch until nothing has failed for settle_s (or the bound is spent): the last failure tells
    # when users saw the service back, the quiet stretch that it stayed back.
    while True:
        time.sleep(1.0)
        now = time.monotonic()
        failures = [o for o in load.since(t0) if not o.ok]
        last = max((o.end for o in failures), default=t0)
        if now - max(last, t0 + (back_s or 0.0)) >= cfg.settle_s or now - t0 > cfg.recover_bound_s + cfg.settle_s:
            break
    row = _row(fault, load.since(t0), t0, back_s, time.monotonic(), cfg)
    if fault != "offload_full":
        return row
    spills = up.spill_counts() - spills_before
    # Without a spill the fault proved nothing: the nodes never wrote to the directory it filled.
    return replace(
        row,
        spilled=spills.spilled,
        spill_failures=spills.failed,
        passed=row.passed and spills.spilled > 0,
        note="" if spills.spilled else "the nodes did not spill: the fault proved nothing",
    )


def run(cfg: FaultConfig, json_path: str | None = None) -> dict:
    """The faults on the path in one deployment; offload_full in a second, whose nodes' KV cache is
    small enough that the load spills (with root: it needs a tmpfs; else its row says skipped)."""
    workdir = Path(tempfile.mkdtemp(prefix="traceless-faults-"))
    rows: list[FaultRow] = []
    orphans, leftovers = 0, []
    path_faults = tuple(f for f in cfg.faults if f != "offload_full")
    deployments = [(path_faults, False)] if path_faults else []
    if "offload_full" in cfg.faults:
        deployments.append((("offload_full",), True))
    try:
        for faults, offload in deployments:
            if offload and os.geteuid() != 0:
                rows.append(
                    FaultRow("offload_full", 0, 0, 0, [], [], 0, 0, None, 0.0, True, "skipped: a tiny tmpfs needs root")
                )
                continue
            (workdir / faults[0]).mkdir()
            found = _deployment(workdir / faults[0], faults, offload, cfg)
            rows += found[0]
            orphans += found[1]
            leftovers += found[2]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "config": {**asdict(cfg), "faults": list(cfg.faults), "node_args": list(cfg.node_args)},
        "rows": [asdict(r) for r in rows],
        "orphans_after_kill_9": orphans,
        "leftovers": leftovers,
        "passed": all(r.passed for r in rows) and orphans == 0 and not leftovers,
    }
    return finish(report, print_report, json_path)


def _deployment(
    workdir: Path, faults: tuple[str, ...], offload: bool, cfg: FaultConfig
) -> tuple[list[FaultRow], int, list[str]]:
    """(rows, services left after `up` was killed with SIGKILL, files left holding the prompt or a spill)."""
    rows: list[FaultRow] = []
    with UpUnderTest.started(workdir, cfg.model, cfg.node_args, offload) as up:
        load = Load(
            up.endpoints["proxy"], up.endpoints["model"], cfg.workers, LOAD_MAX_TOKENS if offload else cfg.max_tokens
        )
        load.start()
        try:
            for fault in faults:
                rows.append(run_fault(fault, up, load, cfg))
        finally:
            load.stop()
        return rows, up.kill_up(), up.leftovers(PROMPT)


def print_report(report: dict) -> None:
    print(
        f"{'fault':<16} {'requests':>8} {'failed':>6} {'in flight':>9} {'statuses':<14} {'back s':>7} "
        f"{'recover s':>9}  verdict"
    )
    for r in report["rows"]:
        back = "-" if r["back_s"] is None else f"{r['back_s']:.1f}"
        statuses = ",".join(str(s) for s in r["statuses"]) + ("+events" if "stream_error" in r["kinds"] else "")
        verdict = "PASS" if r["passed"] else "FAIL"
        spills = "" if r["spilled"] is None else f" (spilled {r['spilled']}, {r['spill_failures']} could not)"
        print(
            f"{r['fault']:<16} {r['requests']:>8} {r['failures']:>6} {r['in_flight_failures']:>9} "
            f"{statuses or '-':<14} {back:>7} {r['recovered_s']:>9.1f}  {verdict} {r['note']}{spills}"
        )
    print(
        f"services left after kill -9 of up: {report['orphans_after_kill_9']}; "
        f"files left holding the prompt or a spill: {len(report['leftovers'])}"
    )
    print("PASS" if report["passed"] else "FAIL", flush=True)
