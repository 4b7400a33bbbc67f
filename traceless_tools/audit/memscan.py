"""Search a process's readable memory (/proc/PID/maps + /proc/PID/mem) for byte strings."""

from __future__ import annotations

import re
from collections.abc import Iterable

CHUNK = 16 << 20


def readable_regions(pid: int) -> list[tuple[int, int]]:
    regions = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+)", line)
            if m and m.group(3).startswith("r") and "[vvar" not in line and "[vsyscall" not in line:
                regions.append((int(m.group(1), 16), int(m.group(2), 16)))
    return regions


def _plan(needles: list[bytes], anchors: Iterable[bytes]) -> dict[bytes, list[tuple[bytes, int]]]:
    """anchor -> [(needle, where the anchor starts in it)]: each needle under the longest anchor it
    contains; without anchors each needle is its own."""
    ranked = sorted(set(anchors), key=len, reverse=True)
    plan: dict[bytes, list[tuple[bytes, int]]] = {}
    for n in dict.fromkeys(needles):
        anchor = next((a for a in ranked if a in n), None) if ranked else n
        if anchor is None:
            raise ValueError("every needle must contain one of the anchors")
        plan.setdefault(anchor, []).append((n, n.index(anchor)))
    return plan


def _count_in(data: bytes, size: int, plan: dict[bytes, list[tuple[bytes, int]]], counts: dict[bytes, int]) -> None:
    """Count the needles that start in data[:size] (data runs on past size by the overlap)."""
    for anchor, group in plan.items():
        pos = data.find(anchor)
        while pos != -1:
            for needle, offset in group:
                start = pos - offset
                if 0 <= start < size and data.startswith(needle, start):
                    counts[needle] += 1
            pos = data.find(anchor, pos + 1)


def scan_process(pid: int, needles: list[bytes], anchors: Iterable[bytes] = ()) -> dict[bytes, int]:
    """Occurrences of each needle in the process's readable memory (overlapping chunk reads, so a
    needle across a chunk boundary is still found). With `anchors` (short strings, each needle
    containing at least one), memory is searched once per anchor and the needles are checked where
    an anchor occurs: many needles cost little more than a few."""
    plan = _plan(needles, anchors)
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
                _count_in(data, size, plan, counts)
                pos += size
    return counts
