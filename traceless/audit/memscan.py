"""Search a process's readable memory (/proc/PID/maps + /proc/PID/mem) for byte strings."""
from __future__ import annotations

import re

CHUNK = 16 << 20


def readable_regions(pid: int) -> list[tuple[int, int]]:
    regions = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+)", line)
            if m and m.group(3).startswith("r") and "[vvar" not in line and "[vsyscall" not in line:
                regions.append((int(m.group(1), 16), int(m.group(2), 16)))
    return regions


def scan_process(pid: int, needles: list[bytes]) -> dict[bytes, int]:
    """Occurrences of each needle in the process's readable memory (overlapping chunk reads, so a
    needle across a chunk boundary is still found)."""
    counts = {n: 0 for n in needles}
    overlap = max(len(n) for n in needles) - 1
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for start, end in readable_regions(pid):
            pos = start
            while pos < end:
                size = min(CHUNK, end - pos)
                try:
                    mem.seek(pos)
                    data = mem.read(size + (overlap if pos + size < end else 0))
                except (OSError, ValueError, OverflowError):
                    break
                for n in needles:
                    counts[n] += data[:size + len(n) - 1].count(n)
                pos += size
    return counts
