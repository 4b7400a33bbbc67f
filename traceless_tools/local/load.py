"""A loaded machine for the attacks and audits: CPU-bound processes beside the services."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """`processes` busy loops (plain Python, one core each) for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
