"""The processes that hold request plaintext are undumpable from the start: no core file
(RLIMIT_CORE 0) and PR_SET_DUMPABLE 0 (no core whatever the rlimit, no ptrace by the same user)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from traceless_tools.local.services import spawn_node, spawn_serve


def core_limit(pid: int) -> str:
    line = next(x for x in open(f"/proc/{pid}/limits") if x.startswith("Max core file size"))
    return " ".join(line.split()[4:6])


def test_make_undumpable_sets_both():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import resource; from traceless.cli.hardening import make_undumpable, is_dumpable\n"
                "before = is_dumpable(); make_undumpable()\n"
                "print(before, is_dumpable(), resource.getrlimit(resource.RLIMIT_CORE))"
            ),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split(maxsplit=2)
    assert out == ["True", "False", "(0, 0)\n"]


@pytest.mark.parametrize("spawn", [spawn_serve, spawn_node], ids=["serve", "node"])
def test_serve_and_node_start_undumpable(tiny_llama_dir, spawn):
    with spawn(
        "--model", str(tiny_llama_dir), "--dtype", "float32", "--kv-cache-memory", "1MiB", "--max-model-len", "128"
    ) as service:
        assert core_limit(service.proc.pid) == "0 0"
