"""Fault audit (`traceless audit faults`): the private path under steady load while one component
at a time fails, and what users saw.

A real `traceless up` (two nodes, its supervisor, the gateway checking health every second) serves
8 workers of the official openai client through the proxy, every other one streaming. One fault at
a time: a node killed (`kill -9`) or stalled (SIGSTOP for `stall_s`, then SIGCONT), the gateway,
the issuer or the relay killed (`up` starts it again), the nodes' KV offload directory filled (a
1 MiB tmpfs; needs root). For each: the requests that failed, with which status, how many were in
flight when the fault came, when the component was back (`back_s`) and when the last request
failed (`recovered_s`). A fault passes when no request hung (client timeout), every failure had
a documented status (DOCUMENTED_STATUSES, or an error event in a stream), the component was back and the
last failure over within `recover_bound_s`, and no request started in the last `settle_s` of its
window failed. A fault is not injected into a request on purpose: "in flight" counts the failed
requests that had started before the fault (most of a worker's time may be spent waiting for a
token, not at a node). At the end `up` itself is killed with SIGKILL: every service must stop (parent-death
signal), and no file of the deployment holds the prompt or a spill file.
"""
from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from traceless.audit.fault_load import PROMPT, Load, Outcome
from traceless.audit.fault_up import UpUnderTest
from traceless.report.output import finish

FAULTS = ("node_kill", "node_stop", "gateway_restart", "relay_restart", "offload_full", "issuer_restart")
QUICK_FAULTS = ("node_kill",)
# What a request may fail with while a component is down (docs/faults.md): 502 (a hop or the node
# failed after the request left), 503 (no healthy node, engine restarting), 504 (the path went
# silent past the client's timeouts), 404 node_not_found (the client drew a node the gateway had
# just dropped).
DOCUMENTED_STATUSES = frozenset({404, 502, 503, 504})


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


def _row(fault: str, seen: list[Outcome], t0: float, back_s: float | None, window_end: float,
         cfg: FaultConfig, note: str = "") -> FaultRow:
    failed = [o for o in seen if not o.ok]
    statuses = sorted({o.status for o in failed if o.status is not None})
    settle = [o for o in failed if o.start >= window_end - cfg.settle_s]
    recovered = max((o.end - t0 for o in failed), default=0.0)
    timeouts = sum(o.kind == "timeout" for o in failed)
    passed = (back_s is not None and timeouts == 0 and not settle and recovered <= cfg.recover_bound_s
              and set(statuses) <= DOCUMENTED_STATUSES
              and all(o.kind in ("status", "stream_error") for o in failed))
    return FaultRow(fault, len(seen), len(failed), sum(o.start < t0 for o in failed), statuses,
                    sorted({o.kind for o in failed}), timeouts, len(settle), back_s, round(recovered, 1), passed, note)


def run_fault(fault: str, up: UpUnderTest, load: Load, cfg: FaultConfig) -> FaultRow:
    """Inject one fault under the running load; watch until the component is back, then settle."""
    time.sleep(3.0)  # steady load before the fault
    t0 = time.monotonic()
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
    return _row(fault, load.since(t0), t0, back_s, time.monotonic(), cfg)


def run(cfg: FaultConfig, json_path: str | None = None) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="traceless-faults-"))
    rows: list[FaultRow] = []
    try:
        with UpUnderTest.started(workdir, cfg.model, cfg.node_args, "offload_full" in cfg.faults) as up:
            load = Load(up.endpoints["proxy"], up.endpoints["model"], cfg.workers, cfg.max_tokens)
            load.start()
            try:
                for fault in cfg.faults:
                    if fault == "offload_full" and up.offload_dir is None:
                        rows.append(FaultRow(fault, 0, 0, 0, [], [], 0, 0, None, 0.0, True,
                                             "skipped: a tiny tmpfs needs root"))
                        continue
                    rows.append(run_fault(fault, up, load, cfg))
            finally:
                load.stop()
            orphans = up.kill_up()
            leftovers = up.leftovers(PROMPT)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {"config": {**asdict(cfg), "faults": list(cfg.faults), "node_args": list(cfg.node_args)},
              "rows": [asdict(r) for r in rows], "orphans_after_kill_9": orphans, "leftovers": leftovers,
              "passed": all(r.passed for r in rows) and orphans == 0 and not leftovers}
    return finish(report, print_report, json_path)


def print_report(report: dict) -> None:
    print(f"{'fault':<16} {'requests':>8} {'failed':>6} {'in flight':>9} {'statuses':<14} {'back s':>7} "
          f"{'recover s':>9}  verdict")
    for r in report["rows"]:
        back = "-" if r["back_s"] is None else f"{r['back_s']:.1f}"
        statuses = ",".join(str(s) for s in r["statuses"]) + ("+events" if "stream_error" in r["kinds"] else "")
        verdict = "PASS" if r["passed"] else "FAIL"
        print(f"{r['fault']:<16} {r['requests']:>8} {r['failures']:>6} {r['in_flight_failures']:>9} "
              f"{statuses or '-':<14} {back:>7} {r['recovered_s']:>9.1f}  {verdict} {r['note']}")
    print(f"services left after kill -9 of up: {report['orphans_after_kill_9']}; "
          f"files left holding the prompt or a spill: {len(report['leftovers'])}")
    print("PASS" if report["passed"] else "FAIL", flush=True)
