"""Clearing the dead part of a thread's stack (csrc/dead_stack.c, loaded with ctypes).

Native code called with request content leaves it in the calling thread's stack: llguidance
parsing a regex keeps the literal it unescaped in a local, the tokenizer the words it split.
Freed-memory scrubbing covers the heap only, and that stack memory is neither freed nor reused
until some later call reaches as deep, so a regex's words stayed in an idle server's memory.
`scrub_dead_stack` clears everything below the caller's frame; each thread that ran request work
calls it once idle, with its allocator cache flush (server/thread_cache.py).

The library is built by setup.py (`build_ext --inplace`, as the node image does) as
`traceless/server/_dead_stack*.so`; it is not a Python extension module, so its file is found with
`find_spec` and opened with ctypes.
"""

from __future__ import annotations

import ctypes
import importlib.util
import threading

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


class DeadStackUnavailable(RuntimeError):
    """The native library is not built."""


def _load() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is None:
            spec = importlib.util.find_spec("traceless.server._dead_stack")
            if spec is None or spec.origin is None:
                raise DeadStackUnavailable(
                    "the dead-stack scrubber is not built: run `python setup.py build_ext "
                    "--inplace` (or `pip install -e .`; needs a C compiler)"
                )
            lib = ctypes.CDLL(spec.origin)
            lib.tl_scrub_dead_stack.argtypes, lib.tl_scrub_dead_stack.restype = [], ctypes.c_int
            lib.tl_stack_bounds.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2
            lib.tl_stack_bounds.restype = ctypes.c_int
            _lib = lib
        return _lib


def check_available() -> None:
    """Raise DeadStackUnavailable at start-up rather than at the first idle period."""
    _load()


def scrub_dead_stack() -> None:
    """Clear this thread's stack below the caller (pages given back, the nearest ones zeroed)."""
    if _load().tl_scrub_dead_stack() != 0:
        raise RuntimeError("could not clear this thread's dead stack")


def stack_bounds() -> tuple[int, int]:
    """[low, high) of this thread's stack (for tests that search it)."""
    low, high = ctypes.c_size_t(), ctypes.c_size_t()
    if _load().tl_stack_bounds(ctypes.byref(low), ctypes.byref(high)) != 0:
        raise RuntimeError("could not read this thread's stack bounds")
    return low.value, high.value
