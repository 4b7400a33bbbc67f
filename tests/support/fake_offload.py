"""An offload store that records which block ids a swap sealed and restored (no tensors)."""

from __future__ import annotations


class FakeOffload:
    def __init__(self):
        self.saved: dict[str, list[int]] = {}
        self.restored: dict[str, list[int]] = {}

    def save(self, rid, ids):
        self.saved[rid] = list(ids)

    def restore(self, rid, ids):
        self.restored[rid] = list(ids)
        self.saved.pop(rid)

    def discard(self, rid):
        self.saved.pop(rid, None)

    def is_swapped(self, rid):
        return rid in self.saved

    def num_swapped(self):
        return len(self.saved)
