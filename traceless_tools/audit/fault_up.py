"""A `traceless up` started for the fault audit, and the faults it can be dealt: its services found
by their command lines, killed or stalled, waited for until they serve again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from traceless_tools.audit.fault_offload import SpillCounts, offload_sizing, spill_counts
from traceless_tools.local.processes import free_port

START_TIMEOUT_S = 300.0
GATEWAY_ARGS = "--health-interval 1 --unhealthy-after 2"


class UpUnderTest:
    def __init__(self, proc: subprocess.Popen, state: Path, endpoints: dict, offload_dir: Path | None):
        self.proc, self.state, self.endpoints, self.offload_dir = proc, state, endpoints, offload_dir

    @classmethod
    @contextmanager
    def started(
        cls, workdir: Path, model: str | None, node_args: tuple[str, ...], offload: bool
    ) -> Iterator[UpUnderTest]:
        """`traceless up --nodes 2` in `workdir`; with `offload` (and root) the nodes have a KV cache
        small enough that the load preempts, and spill KV to a tmpfs of their own (fault_offload.py).
        Stopped (SIGKILL of its group, tmpfs unmounted) when the block ends."""
        offload_dir = workdir / "offload" if offload and os.geteuid() == 0 else None
        args = list(node_args) + (["--model", model] if model else [])
        if offload_dir is not None:
            sizing = offload_sizing(model, node_args)
            offload_dir.mkdir(mode=0o700)
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={sizing.tmpfs_bytes},mode=0700", "tmpfs", str(offload_dir)],
                check=True,
            )
            args += [*sizing.node_args, "--kv-offload", "disk", "--kv-offload-dir", str(offload_dir)]
        state = workdir / "state"
        with open(workdir / "up.log", "wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "traceless_tools.cli",
                    "up",
                    "--nodes",
                    "2",
                    "--port",
                    str(free_port()),
                    "--state-dir",
                    str(state),
                    "--node-args",
                    " ".join(args),
                    "--gateway-args",
                    GATEWAY_ARGS,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            up = cls(proc, state, _wait_endpoints(proc, state, workdir / "up.log"), offload_dir)
            up.wait_serving(START_TIMEOUT_S)
            yield up
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if offload_dir is not None:
                subprocess.run(["umount", str(offload_dir)], check=False)

    # --- the services ------------------------------------------------------------------------------
    def children(self) -> dict[str, int]:
        """name -> pid of each service `up` runs now (nodes by their port)."""
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)], capture_output=True, text=True)
        node_ports = {url.rsplit(":", 1)[1]: f"node{i}" for i, url in enumerate(self.endpoints["nodes"])}
        found = {}
        for pid in (int(x) for x in out.stdout.split()):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            cmd = _command(argv)
            if cmd is None:
                continue
            if cmd[0] == "node":
                found[node_ports.get(cmd[cmd.index("--port") + 1], "node?")] = pid
            elif cmd[0] == "log":
                found["witness" if cmd[1] == "witness" else "log"] = pid
            else:
                found[cmd[0]] = pid
        return found

    def serving(self, name: str) -> bool:
        e = self.endpoints
        checks = {
            "gateway": e["gateway"] + "/pcc/v1/challenge",
            "relay": e["relay"] + "/pcc/v1/challenge",
            "issuer": e["issuer"] + "/token-issuer-directory",
        }
        try:
            if name in checks and httpx.get(checks[name], timeout=2).status_code != 200:
                return False
            listed = httpx.get(e["gateway"] + "/pcc/v1/nodes", params={"model": e["model"], "k": 16}, timeout=5)
            return listed.status_code == 200 and len(listed.json()["nodes"]) == len(e["nodes"])
        except (httpx.HTTPError, ValueError, KeyError):
            return False

    def wait_serving(self, timeout_s: float, name: str = "", old_pid: int | None = None) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = self.children().get(name) if name else None
            if (old_pid is None or (pid is not None and pid != old_pid)) and self.serving(name):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.5)
        return False

    # --- faults ------------------------------------------------------------------------------------
    def kill_and_wait(self, name: str, sig: int, timeout_s: float) -> bool:
        pid = self.children()[name]
        os.kill(pid, sig)
        return self.wait_serving(timeout_s, name, pid)

    def stall_and_wait(self, name: str, stall_s: float, timeout_s: float) -> bool:
        pid = self.children()[name]
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(stall_s)
        finally:
            os.kill(pid, signal.SIGCONT)
        return self.wait_serving(timeout_s, name)

    def fill_offload(self, hold_s: float) -> bool:
        """Fill the offload tmpfs to the last byte for `hold_s`, then free it."""
        if self.offload_dir is None:
            raise RuntimeError("the deployment has no offload directory")
        filler = self.offload_dir / "filler"
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass  # full
        try:
            time.sleep(hold_s)
        finally:
            filler.unlink()
        return self.wait_serving(30.0)

    def spill_counts(self) -> SpillCounts:
        """Spills (and spill failures) of every node so far, from their event logs."""
        return spill_counts(self.state / "logs")

    # --- the end -----------------------------------------------------------------------------------
    def kill_up(self) -> int:
        """SIGKILL `up` itself; returns how many of its services are still running 20 s later."""
        pids = list(self.children().values())
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)
        alive = [p for p in pids if _alive(p)]
        for p in alive:  # the audit cleans up after a failure it reports
            os.kill(p, signal.SIGKILL)
        return len(alive)

    def leftovers(self, text: str) -> list[str]:
        """Files of the deployment that hold `text` (the load's prompt), and any spill file."""
        found = []
        for path in self.state.rglob("*"):
            if path.is_file() and text.encode() in path.read_bytes():
                found.append(str(path.relative_to(self.state)))
        if self.offload_dir is not None:
            found += [f"offload/{p.name}" for p in self.offload_dir.iterdir()]
        return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) no longer serves.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_endpoints(proc: subprocess.Popen, state: Path, log: Path) -> dict:
    deadline = time.monotonic() + START_TIMEOUT_S
    path = state / "endpoints.json"
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if proc.poll() is not None:
            tails = [f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((state / "logs").glob("*.log"))]
            raise RuntimeError("traceless up exited during startup:\n" + log.read_text()[-2000:] + "\n".join(tails))
        time.sleep(0.5)
    raise RuntimeError("traceless up did not start")


def _command(argv: list[str]) -> list[str] | None:
    """The traceless command in a process's argv: after `-m traceless.cli` (the core's commands) or
    `-m traceless_tools.cli` (all of them), or after the `-c` boot line a node uses once it has
    restarted itself isolated from its environment (traceless/cli/isolation.py)."""
    for module in ("traceless.cli", "traceless_tools.cli"):
        if module in argv:
            return argv[argv.index(module) + 1 :]
    if "-c" in argv:
        at = argv.index("-c")
        if at + 1 < len(argv) and "traceless.cli.parser" in argv[at + 1]:
            return argv[at + 2 :]
    return None
