"""Start traceless services as real processes on loopback, for the audit and attack tools."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from traceless_tools.local.processes import free_port, stop, wait_ready

__all__ = ["Service", "free_port", "spawn_node", "spawn_serve", "stop", "wait_ready"]


@dataclass
class Service:
    name: str
    url: str
    proc: subprocess.Popen
    log_path: Path
    metrics_url: str  # the operator's listener (GET /metrics)

    def logs(self) -> bytes:
        return self.log_path.read_bytes() if self.log_path.exists() else b""


@contextmanager
def spawn_serve(*args: str, name: str = "serve", workdir: Path | None = None):
    """`traceless serve ARGS` on a free port (its operator listener on another); yields a Service;
    stops it (SIGINT) on exit. Without a `workdir`, the service runs in a temporary one that is
    removed with it."""
    with _spawn("serve", args, name, workdir) as service:
        yield service


@contextmanager
def spawn_node(*args: str, name: str = "node", workdir: Path | None = None):
    """`traceless node ARGS` (no gateway: reached directly over OHTTP), as spawn_serve."""
    with _spawn("node", args, name, workdir) as service:
        yield service


@contextmanager
def _spawn(command: str, args: tuple[str, ...], name: str, workdir: Path | None):
    owned = workdir is None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="traceless-audit-"))
    port, metrics_port = free_port(), free_port()
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "traceless_tools.cli",
                command,
                "--port",
                str(port),
                "--metrics-port",
                str(metrics_port),
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    service = Service(name, f"http://127.0.0.1:{port}", proc, log_path, f"http://127.0.0.1:{metrics_port}")
    try:
        wait_ready(proc, service.url + "/health", what=name)
        yield service
    finally:
        stop(proc)
        if owned:
            shutil.rmtree(workdir, ignore_errors=True)
