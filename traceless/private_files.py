"""Files that hold secrets (API keys, endpoints.json with its key): written 0600 from the first
byte, whatever the umask, and replaced atomically so no reader ever sees a partial file or a
moment in which the file is readable by others."""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_MODE = 0o600


def write_private(path: str | Path, data: bytes | str) -> None:
    """Write `data` to `path`, mode 0600 (an existing file is replaced, not rewritten in place)."""
    target = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), PRIVATE_MODE)  # the umask cannot widen it, nor narrow it below owner rw
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
