"""The paged KV cache tensors, sized from a memory budget.

Layout (see csrc/kernels.c for why K is transposed):
    k: [num_slots, num_blocks, num_kv_heads, head_dim, block_size]
    v: [num_slots, num_blocks, num_kv_heads, block_size, head_dim]
Slot s of a block is token (s % block_size) of block (s // block_size). The first dimension holds
one layer per slot: every layer for a model of one attention kind; with local and global layers,
the layers of one KV group (model/kv_groups.py), whose block table says which blocks are its own.
"""

from __future__ import annotations

import torch

from traceless.model.config import ModelConfig


def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V of one block: block_size tokens of every layer slot."""
    per_token = 2 * config.kv_groups.num_slots * config.num_kv_heads * config.head_dim
    return per_token * block_size * torch.empty((), dtype=dtype).element_size()


class KVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
        self.groups = config.kv_groups
        L, H, D = self.groups.num_slots, config.num_kv_heads, config.head_dim
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.k = torch.zeros(L, num_blocks, H, D, block_size, dtype=dtype, device=device)
        self.v = torch.zeros(L, num_blocks, H, block_size, D, dtype=dtype, device=device)
        self._deferred = False
        self._pending: list[int] = []  # freed blocks not zeroed yet (deferred zeroing)

    def defer_zeroing(self) -> None:
        """From now on zero_blocks only records the blocks: the owner (the CUDA runner's device
        scrubber) zeroes them in its once-per-step sweep, before any later step runs. Every read
        or write through this class zeroes what is pending first."""
        self._deferred = True

    def take_pending(self) -> list[int]:
        """The freed blocks not zeroed yet; the caller zeroes them now."""
        out, self._pending = self._pending, []
        return out

    def flush(self) -> None:
        """Zero the pending blocks now (paths outside a step: offload, scans)."""
        if self._pending:
            self._zero(self.take_pending())

    def resize(self, num_blocks: int) -> None:
        """Replace the tensors by zeroed ones of `num_blocks` blocks (after the start-up profiling
        pass, which ran on a small cache). The old tensors are zeroed before they are freed."""
        self._pending.clear()  # zeroed below with everything else
        L, _, H, D, bs = self.k.shape
        self.k.zero_()
        self.v.zero_()
        dtype, device = self.k.dtype, self.k.device
        del self.k, self.v
        self.k = torch.zeros(L, num_blocks, H, D, bs, dtype=dtype, device=device)
        self.v = torch.zeros(L, num_blocks, H, bs, D, dtype=dtype, device=device)
        self.num_blocks = num_blocks

    def k_of(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s K: [num_blocks, kv_heads, head_dim, block_size] (its group's blocks hold it)."""
        return self.k[self.groups.layer_slot[layer]]

    def v_of(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s V: [num_blocks, kv_heads, block_size, head_dim]."""
        return self.v[self.groups.layer_slot[layer]]

    def write(self, layer: int, slots: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor) -> None:
        """Store this step's keys and values. slots = (block ids, offsets), each [T]; k, v: [T, H, D]."""
        self.flush()
        blocks, offsets = slots
        # a float16 cache under float32 activations: rounded to nearest even, as the native kernel does
        self.k_of(layer)[blocks, :, :, offsets] = k.to(self.k.dtype)
        self.v_of(layer)[blocks, :, offsets] = v.to(self.v.dtype)

    def zero_blocks(self, block_ids: list[int]) -> None:
        if self._deferred:
            self._pending.extend(block_ids)
        else:
            self._zero(block_ids)

    def _zero(self, block_ids: list[int]) -> None:
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.k.device)
        self.k.index_fill_(1, idx, 0)
        self.v.index_fill_(1, idx, 0)

    def count_nonzero(self, start: int, end: int) -> int:
        """How many of blocks [start, end) hold any non-zero value (one slice of an idle scan)."""
        self.flush()
        k = self.k[:, start:end].ne(0).flatten(2).any(-1).any(0)
        v = self.v[:, start:end].ne(0).flatten(2).any(-1).any(0)
        return int((k | v).sum())

    def nonzero_blocks(self, chunk: int = 256) -> set[int]:
        """Ids of blocks holding any non-zero value (for integrity checks; scans the whole cache a
        slice of blocks at a time, so the scan's temporaries stay small next to a GPU-sized cache)."""
        self.flush()
        found: set[int] = set()
        for start in range(0, self.num_blocks, chunk):
            end = min(start + chunk, self.num_blocks)
            used = self.k[:, start:end].ne(0).flatten(2).any(-1).any(0) | self.v[:, start:end].ne(0).flatten(2).any(
                -1
            ).any(0)
            found.update(start + int(i) for i in torch.nonzero(used).flatten().tolist())
        return found
