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

The node image starts isolated from its first instruction: its ENTRYPOINT is `boot_argv` (the
interpreter with `-s -P`, the package root put on the path by the command itself) and its
environment holds no PYTHON*/LD_* variable but scrubbing's, so nothing of the environment ever
runs, not even in a first process that would restart itself (`starts_isolated` checks a command
line and environment; the deployment tests run it on the image and every manifest).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import traceless

INJECTING = ("PYTHON", "LD_", "GLIBC_TUNABLES")
ISOLATED_FLAGS = ("-s", "-P")  # no user site directory; no script or working directory on the path
_BOOT = "import sys; sys.path.insert(0, {root!r}); from traceless.cli.parser import main; sys.exit(main())"


def boot_argv(python: str, root: str) -> list[str]:
    """The command line, before the command's own arguments, that runs traceless from `root`
    (the folder holding the package) isolated: flags on the interpreter, no PYTHONPATH needed."""
    return [python, *ISOLATED_FLAGS, "-c", _BOOT.format(root=root)]


def starts_isolated(argv: list[str], env: dict[str, str], scrub_env: dict[str, str]) -> bool:
    """Whether `argv` run with exactly `env` is already in the isolated state (so the node does not
    restart itself): the interpreter's flags before its -c/-m, and the injecting variables."""
    end = next((i for i, a in enumerate(argv) if a in ("-c", "-m")), len(argv))
    flags = argv[1:end]
    return _state(("-s" in flags, "-P" in flags), env, []) == canonical_digest(scrub_env)


def _state(flags: tuple[bool, bool], env: dict[str, str], customize: list[str]) -> str:
    doc = {
        "no_user_site": flags[0],
        "safe_path": flags[1],
        "customize": sorted(customize),
        "env": sorted((k, v) for k, v in env.items() if k.startswith(INJECTING)),
    }
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
    os.execve(sys.executable, [*boot_argv(sys.executable, root), *sys.argv[1:]], isolated_env(scrub_env))


def require_isolated(scrub_env: dict[str, str]) -> None:
    if current_digest() != canonical_digest(scrub_env):
        raise SystemExit(
            "traceless node: not isolated from its environment (PYTHON*/LD_* variables, a "
            "site-customize module or the interpreter's flags differ from the measured state)"
        )
