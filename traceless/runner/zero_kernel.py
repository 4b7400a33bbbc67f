"""One kernel that zeroes a list of device byte ranges: the scrub of a step (freed KV blocks, the
allocator's free blocks, the decode graphs' pool) in one upload and one launch, whatever the
number of ranges.

The host packs the ranges (16-byte aligned, whole 16-byte units: what the allocator's blocks, the
graph pool's segments and KV blocks are) as (address, 8-byte words) pairs, each range cut into pieces of at most
CHUNK_WORDS words so that one program zeroes one piece; the list goes to the device in one
non-blocking copy from a pinned buffer (reused once the copy that last read it is done) into a
device buffer allocated *before* the caller looks at the allocator's free blocks, so the list is
never among the ranges it zeroes. Under TRITON_INTERPRET=1 the kernel runs on host addresses,
which is how the suite checks it on a CPU.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

WORD = 8  # bytes: the kernel stores int64 words, two at a time (16-byte stores)
ALIGN = 16  # bytes: every range starts and ends on a multiple
CHUNK_WORDS = 1 << 17  # 1 MiB per program
_BLOCK = 1024  # words stored per loop iteration (8 KiB)


@triton.jit
def _zero_ranges_kernel(ranges_ptr, BLOCK: tl.constexpr):
    """Program i zeroes piece i: ranges[i] = (address, words), words <= CHUNK_WORDS."""
    i = tl.program_id(0).to(tl.int64)
    addr = tl.multiple_of(tl.load(ranges_ptr + 2 * i), 16)
    words = tl.multiple_of(tl.load(ranges_ptr + 2 * i + 1), 2)  # whole 16-byte units: 16-byte stores
    base = tl.multiple_of(addr.to(tl.pointer_type(tl.int64)), 16)
    zeros = tl.zeros([BLOCK], tl.int64)
    for start in range(0, words, BLOCK):
        offs = tl.max_contiguous(tl.multiple_of(start + tl.arange(0, BLOCK), BLOCK), BLOCK)
        tl.store(base + offs, zeros, mask=offs < words)


def pieces(ranges: np.ndarray) -> np.ndarray:
    """(address, bytes) rows [N, 2] int64 -> (address, words) rows, each at most CHUNK_WORDS words."""
    ranges = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    if ranges.size and (np.any(ranges[:, 0] % ALIGN) or np.any(ranges[:, 1] % ALIGN)):
        raise ValueError("device ranges to zero must be 16-byte aligned and sized")
    words = ranges[:, 1] // WORD
    counts = -(-words // CHUNK_WORDS)
    keep = counts > 0
    ranges, words, counts = ranges[keep], words[keep], counts[keep]
    first = np.repeat(np.cumsum(counts) - counts, counts)
    k = np.arange(int(counts.sum()), dtype=np.int64) - first  # piece index within its range
    out = np.empty((len(k), 2), dtype=np.int64)
    out[:, 0] = np.repeat(ranges[:, 0], counts) + k * CHUNK_WORDS * WORD
    out[:, 1] = np.minimum(np.repeat(words, counts) - k * CHUNK_WORDS, CHUNK_WORDS)
    return out


class RangeZeroer:
    """Zeroes lists of device byte ranges, one upload and one launch per call."""

    def __init__(self, device: torch.device):
        self.device = device
        self._pinned = device.type == "cuda"
        self._host = torch.zeros(0, dtype=torch.int64)
        self._dev = torch.zeros(0, dtype=torch.int64, device=device)
        self._copied: torch.cuda.Event | None = None
        self.launches = 0

    def reserve(self, num_pieces: int) -> bool:
        """Room for num_pieces pieces on host and device; True when the device buffer was
        reallocated (a caller that listed free blocks before must list them again)."""
        if self._dev.numel() >= 2 * num_pieces:
            return False
        n = max(2 * num_pieces, 2 * self._dev.numel(), 512)
        self._dev = torch.zeros(n, dtype=torch.int64, device=self.device)
        return True

    def zero(self, ranges: np.ndarray) -> int:
        """Zero every (address, bytes) range (after everything already on the current stream);
        returns the bytes zeroed. The device buffer must hold the pieces (reserve first)."""
        p = pieces(ranges)
        if not len(p):
            return 0
        if self._dev.numel() < p.size:
            raise RuntimeError("RangeZeroer.reserve was not called for this many ranges")
        if self._copied is not None:
            self._copied.synchronize()  # the last list's copy (long done: a step ran since)
        if self._host.numel() < p.size:
            self._host = torch.zeros(max(p.size, 2 * self._host.numel()), dtype=torch.int64, pin_memory=self._pinned)
        self._host[: p.size].numpy()[:] = p.reshape(-1)
        self._dev[: p.size].copy_(self._host[: p.size], non_blocking=True)
        if self._pinned:
            self._copied = torch.cuda.Event()
            self._copied.record()
        _zero_ranges_kernel[(len(p),)](self._dev, BLOCK=_BLOCK)
        self.launches += 1
        return int(p[:, 1].sum()) * WORD
