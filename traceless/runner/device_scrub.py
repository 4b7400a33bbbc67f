"""Zero the device memory finished requests left behind: once per step, in one kernel.

PyTorch's caching allocator keeps freed blocks for reuse without clearing them, so the
activations, logits and token-id tensors of past steps stay readable in free device memory (on an
H100, 24,575 of 24,576 KV values survived a "zeroed" offload in a fresh allocation). The decode
graphs' private pool holds the activations of the last replay of each captured size.

The runner sweeps once per engine step (and after an abort or a prefix-cache expiry), never per
request: the KV blocks freed since the last sweep (the cache defers them here, kv_cache.py), and,
when a request ended, every free block of the allocator's default pool and every segment of the
graphs' pool, all as byte ranges zeroed by one launch of zero_kernel.py. Nothing waits for the
device: the ranges are zeroed in stream order after the steps that used them and before any later
step that reuses them. Zeroing the graphs' pool in place is safe because a replay writes every
intermediate before it reads it (the captured kernels compute from the metadata buffers only).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from traceless.model.layers.kv_cache import KVCache
from traceless.runner.zero_kernel import RangeZeroer, pieces

DEFAULT_POOL = (0, 0)


def free_ranges(segments: list[dict], device_index: int, pools: set[tuple[int, int]]) -> np.ndarray:
    """(address, bytes) [N, 2] of every inactive block of the default pool on the device, and of
    every segment (whole) of the private pools in `pools`. Blocks are listed in address order
    within a segment (as torch's memory viewer reads them)."""
    out: list[tuple[int, int]] = []
    for seg in segments:
        if seg.get("device") != device_index:
            continue
        pool = tuple(seg.get("segment_pool_id", DEFAULT_POOL))
        if pool in pools:
            out.append((seg["address"], seg["total_size"]))
        elif pool == DEFAULT_POOL:
            addr = seg["address"]
            for b in seg["blocks"]:
                if b["state"] == "inactive":
                    out.append((addr, b["size"]))
                addr += b["size"]
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def kv_block_ranges(cache: KVCache, block_ids: list[int]) -> np.ndarray:
    """(address, bytes) of blocks `block_ids` in every layer of K and V: [2 L len(ids), 2]."""
    out = []
    ids = np.asarray(block_ids, dtype=np.int64)
    for t in (cache.k, cache.v):  # [L, NB, ...] contiguous
        L, nb = t.shape[0], t.shape[1]
        size = t[0, 0].numel() * t.element_size()
        index = (np.arange(L, dtype=np.int64)[:, None] * nb + ids[None, :]).reshape(-1)
        out.append(np.stack([t.data_ptr() + index * size, np.full_like(index, size)], 1))
    return np.concatenate(out)


class DeviceScrubber:
    def __init__(
        self, cache: KVCache, device: torch.device, snapshot: Callable[[], list[dict]] = torch.cuda.memory_snapshot
    ):
        self.cache = cache
        self.device = device
        if device.index is not None:
            self._index = device.index
        else:  # (a CPU stands in for device 0 in tests)
            self._index = torch.cuda.current_device() if device.type == "cuda" else 0
        self._snapshot = snapshot
        self.zeroer = RangeZeroer(device)
        self.graph_pools: set[tuple[int, int]] = set()
        self._ran = False  # a step ran since free memory was last zeroed
        self._ended = False  # a request ended since then
        cache.defer_zeroing()

    def step_ran(self) -> None:
        self._ran = True

    def request_ended(self) -> None:
        self._ended = True

    def sweep(self) -> int:
        """Zero what is pending (see the module docstring); returns the bytes zeroed."""
        kv = kv_block_ranges(self.cache, self.cache.take_pending())
        if not (self._ran and self._ended):
            if not len(kv):
                return 0
            self.zeroer.reserve(len(pieces(kv)))
            return self.zeroer.zero(kv)
        while True:  # the list's device buffer is reserved before free blocks are listed
            ranges = np.concatenate([kv, free_ranges(self._snapshot(), self._index, self.graph_pools)])
            if not self.zeroer.reserve(len(pieces(ranges))):
                break
        self._ran = self._ended = False
        return self.zeroer.zero(ranges)
