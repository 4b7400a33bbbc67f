"""A file-size limit for this process (RLIMIT_FSIZE), the way a full disk looks to a writer that
needs more room: a write past the limit fails with EFBIG (SIGXFSZ, which would kill the process,
is ignored meanwhile). Pipes and sockets are not files: pytest's and xdist's channels are unaffected."""

from __future__ import annotations

import resource
import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
