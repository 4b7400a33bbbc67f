"""Search a process's readable memory (/proc/PID/maps + /proc/PID/mem) for byte strings."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache

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


def _count_at_anchors(
    data: bytes, size: int, plan: dict[bytes, list[tuple[bytes, int]]], counts: dict[bytes, int]
) -> None:
    """As _count_in, with one pass over `data` for all anchors instead of one per anchor: a
    regular expression of the anchors, longest first, finds each place one starts; the anchors
    that start there are the one it found and those of them that are its prefixes."""
    search, starting = _finder(tuple(plan))
    pos = 0
    while (m := search(data, pos)) is not None:
        at = m.start()
        for anchor in starting[m.group()]:
            for needle, offset in plan[anchor]:
                start = at - offset
                if 0 <= start < size and data.startswith(needle, start):
                    counts[needle] += 1
        pos = at + 1


@lru_cache(maxsize=8)
def _finder(anchors: tuple[bytes, ...]) -> tuple[Callable, dict[bytes, list[bytes]]]:
    """(search, anchor -> the anchors that are its prefixes, itself included)."""
    ranked = sorted(anchors, key=len, reverse=True)
    pattern = re.compile(b"|".join(re.escape(a) for a in ranked))
    return pattern.search, {a: [b for b in ranked if a.startswith(b)] for a in ranked}


def scan_process(pid: int, needles: list[bytes], anchors: Iterable[bytes] = ()) -> dict[bytes, int]:
    """Occurrences of each needle in the process's readable memory (overlapping chunk reads, so a
    needle across a chunk boundary is still found). With `anchors` (short strings, each needle
    containing at least one), memory is searched once for all anchors and the needles are checked
    where an anchor occurs: many needles cost little more than a few. (A regular expression's pass
    is quick while its strings' first bytes are rare: anchors that start with a zero byte, or
    hundreds of needles without anchors, would make it slow; without anchors each needle is
    searched for on its own.)"""
    anchors = tuple(anchors)
    plan = _plan(needles, anchors)
    count = _count_at_anchors if anchors else _count_in
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
                count(data, size, plan, counts)
                pos += size
    return counts
