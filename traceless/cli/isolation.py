"""The node runs isolated from its environment: what the environment could inject is not loaded.

Python reads code from PYTHONPATH (a `sitecustomize.py` there runs at start), PYTHONSTARTUP,
PYTHONHOME and the user's site directory; the dynamic loader runs LD_PRELOAD / LD_LIBRARY_PATH
code; GLIBC_TUNABLES changes the allocator. None of that is in the measured code. So the node
starts itself again (as freed-memory scrubbing already does) with `-s -P` (no user site, no
script directory on the path), the traceless package it was started from first on the path, and
an environment from which every PYTHON* (but PYTHONMALLOC), LD_* and GLIBC_TUNABLES variable is
removed; then it checks that this is so and refuses to start otherwise. (`python -I` would also
drop PYTHONMALLOC, which scrubbing needs.)

The rule is part of the node's measurement: `environment` in its measured configuration is the
digest of the isolated state (`canonical_digest`), so a node built to run otherwise is a
different release.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import traceless

INJECTING = ("PYTHON", "LD_", "GLIBC_TUNABLES")
_BOOT = "import sys; sys.path.insert(0, {root!r}); from traceless.cli.parser import main; sys.exit(main())"


def _state(flags: tuple[bool, bool], env: dict[str, str], customize: list[str]) -> str:
    doc = {"no_user_site": flags[0], "safe_path": flags[1], "customize": sorted(customize),
           "env": sorted((k, v) for k, v in env.items() if k.startswith(INJECTING))}
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


def canonical_digest(scrub_env: dict[str, str]) -> str:
    """The digest of an isolated node's state (what the measured configuration records)."""
    return _state((True, True), scrub_env, [])


def current_digest() -> str:
    customize: list[str] = [m for m in ("sitecustomize", "usercustomize") if m in sys.modules]
    return _state((bool(sys.flags.no_user_site), bool(sys.flags.safe_path)), dict(os.environ), customize)


def isolated_env(scrub_env: dict[str, str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(INJECTING)}, **scrub_env}


def reexec_isolated(scrub_env: dict[str, str]) -> None:
    """Start this command again isolated (with scrub_env set); returns only when already so."""
    if current_digest() == canonical_digest(scrub_env):
        return
    root = str(Path(traceless.__file__).resolve().parent.parent)
    os.execve(sys.executable, [sys.executable, "-s", "-P", "-c", _BOOT.format(root=root), *sys.argv[1:]],
              isolated_env(scrub_env))


def require_isolated(scrub_env: dict[str, str]) -> None:
    if current_digest() != canonical_digest(scrub_env):
        raise SystemExit("traceless node: not isolated from its environment (PYTHON*/LD_* variables, a "
                         "site-customize module or the interpreter's flags differ from the measured state)")
