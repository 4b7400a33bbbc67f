"""Reading this process's own memory (a thread's stack) for tests that search it."""

from __future__ import annotations


def read_own_memory(low: int, high: int) -> bytes:
    """Bytes [low, high) of this process's address space, through /proc/self/mem."""
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        mem.seek(low)
        return mem.read(high - low)
