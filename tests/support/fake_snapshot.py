"""Stand-ins for torch.cuda.memory_snapshot() segments (what the device scrubber reads)."""

from __future__ import annotations


def segment(
    device: int, address: int, pool: tuple[int, int], blocks: list[tuple[int, str]], total: int | None = None
) -> dict:
    """One segment at `address` of `pool`, its blocks (size, state) in address order."""
    return {
        "device": device,
        "address": address,
        "segment_pool_id": pool,
        "total_size": total if total is not None else sum(size for size, _ in blocks),
        "blocks": [{"size": size, "state": state} for size, state in blocks],
    }
