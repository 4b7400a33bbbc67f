"""The node runs isolated from its environment: a sitecustomize on PYTHONPATH and an LD_PRELOAD
library do not reach the process that serves, and a process that is not isolated refuses to start;
the isolated state's digest is in the measured configuration."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

from traceless.cli.isolation import canonical_digest
from traceless.cli.scrubbing import SCRUB_ENV
from traceless_tools.local.services import spawn_node

REPO = Path(__file__).resolve().parents[2]


def test_injected_code_does_not_reach_the_serving_node(tiny_llama_dir, tmp_path, monkeypatch):
    inject = tmp_path / "inject"
    inject.mkdir()
    marker = tmp_path / "ran"
    (inject / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('ran\\n')\n")
    libm = ctypes.util.find_library("m")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(inject), str(REPO)]))
    monkeypatch.setenv("LD_PRELOAD", libm)
    with spawn_node(
        "--model", str(tiny_llama_dir), "--dtype", "float32", "--kv-cache-memory", "1MiB", "--max-model-len", "128"
    ) as node:
        environ = Path(f"/proc/{node.proc.pid}/environ").read_bytes().split(b"\0")
        cmdline = Path(f"/proc/{node.proc.pid}/cmdline").read_bytes().split(b"\0")
    assert not [v for v in environ if v.startswith((b"PYTHONPATH=", b"LD_PRELOAD=", b"PYTHONSTARTUP="))]
    assert b"PYTHONMALLOC=malloc" in environ and cmdline[1:3] == [b"-s", b"-P"]
    # the sitecustomize ran in the process that was started, never in the one that serves
    assert marker.read_text() == "ran\n"


def test_a_process_that_is_not_isolated_refuses_to_start(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    r = subprocess.run(
        [sys.executable, "-c", "from traceless.cli.isolation import require_isolated; require_isolated({})"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "not isolated" in r.stderr


def test_the_isolated_state_is_measured():
    from traceless.cli.node import node_measured_config, node_parser

    on = node_measured_config(node_parser().parse_args([]))
    off = node_measured_config(node_parser().parse_args(["--no-scrub-freed-memory"]))
    assert on["environment"] == canonical_digest(SCRUB_ENV) != off["environment"] == canonical_digest({})


def test_a_process_started_as_the_image_starts_the_node_is_already_isolated(tmp_path):
    """The image's ENTRYPOINT (boot_argv) and an environment of scrubbing's variables alone: the
    process that starts is in the measured state, so the node never restarts itself there."""
    from traceless.cli.isolation import boot_argv, starts_isolated

    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", ""), **SCRUB_ENV}
    argv = [*boot_argv(sys.executable, str(REPO)), "node"]
    assert starts_isolated(argv, env, SCRUB_ENV)
    assert not starts_isolated([sys.executable, "-m", "traceless.cli", "node"], env, SCRUB_ENV)
    assert not starts_isolated(argv, {**env, "LD_PRELOAD": "x.so"}, SCRUB_ENV)
    probe = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from traceless.cli.isolation import canonical_digest, "
        "current_digest; from traceless.cli.scrubbing import SCRUB_ENV; "
        "print(current_digest() == canonical_digest(SCRUB_ENV))"
    )
    r = subprocess.run([*argv[:-2], probe], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.stdout.strip() == "True", r.stderr
