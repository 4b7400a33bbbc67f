"""Directories a command writes to, checked before anything starts."""

from __future__ import annotations

import tempfile
from pathlib import Path

from traceless.errors import ConfigError


def writable_dir(path: str | Path, option: str) -> Path:
    """Create `path` if needed (0700: state directories hold keys and tree heads) and make sure a
    file can be written in it; ConfigError naming the option otherwise (a read-only parent, a plain
    file in the way)."""
    directory = Path(path).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise ConfigError(f"{option} {directory}: cannot write there ({exc.strerror or type(exc).__name__})") from None
    return directory
