"""Zero the device memory a finished request's steps left behind.

PyTorch's caching allocator keeps freed blocks for reuse without clearing them, so the
activations, logits and token-id tensors of past steps stay readable in free device memory (on an
H100, 24,575 of 24,576 KV values survived a "zeroed" offload in a fresh allocation; issue 13).
When a request ends, the runner scrubs: every inactive block of the default pool is taken with an
allocation of exactly its size, zeroed, and given back; memory the scrub had to add is returned to
the driver. The decode graphs' private pool is scrubbed by replaying the graphs on zeroed metadata
(cuda_graphs.py), which overwrites their activations with those of token 0 at position 0.
"""
from __future__ import annotations

import torch

DEFAULT_POOL = (0, 0)


def inactive_block_sizes(device: torch.device) -> list[int]:
    """Sizes of the free blocks the allocator caches on `device` outside private (graph) pools."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    sizes = []
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device") != index or tuple(seg.get("segment_pool_id", DEFAULT_POOL)) != DEFAULT_POOL:
            continue
        sizes += [b["size"] for b in seg["blocks"] if b["state"] == "inactive"]
    return sizes


def scrub_free_device_memory(device: torch.device) -> int:
    """Zero every cached free block of the default pool; returns the bytes zeroed."""
    sizes = inactive_block_sizes(device)
    if not sizes:
        return 0
    reserved = torch.cuda.memory_reserved(device)
    held = []
    zeroed = 0
    with torch.inference_mode():
        for size in sorted(sizes, reverse=True):  # largest first: each takes its own block
            try:
                t = torch.empty(size, dtype=torch.uint8, device=device)
            except torch.OutOfMemoryError:
                break
            t.zero_()
            held.append(t)
            zeroed += size
    del held
    if torch.cuda.memory_reserved(device) > reserved:
        torch.cuda.empty_cache()  # segments the scrub added (they are zero) go back to the driver
    return zeroed
