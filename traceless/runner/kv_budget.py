"""How many KV cache blocks an engine gets where no profiling pass sizes them (the CPU, or an
explicit --kv-cache-memory).

Without a size, the CPU's cache holds what the configuration can use: `max_num_seqs` sequences of
a share (1 / MODEL_LEN_SHARE) of `max_model_len` each, and never less than one full-length
sequence, bounded by MAX_DEFAULT_CPU_BYTES. A 135M model (8192-token context, 23 KiB of K and V per
token in bfloat16) so gets 32,768 tokens, 0.7 GiB, where a fixed 2 GiB held 93,000 tokens no
workload on a CPU keeps in flight. Requests beyond it wait or are preempted, as on any full cache.
With local and global layers (model/kv_groups.py) the blocks are counted per KV group: a global
group holds a sequence's every token, a windowed group at most its window and one chunk.
`gpu_memory_utilization` is a CUDA setting (a fraction of the device's memory, after a profiling
pass): on the CPU it is refused rather than read as a fraction of system memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from traceless.config import DEFAULT_CPU_KV_BYTES, EngineConfig

MODEL_LEN_SHARE = 32  # the default cache gives each of max_num_seqs sequences max_model_len / 32 tokens
MAX_DEFAULT_CPU_BYTES = DEFAULT_CPU_KV_BYTES


class KVSizing(Enum):
    CONFIGURED = "kv_cache_memory"  # the size given
    WORKLOAD = "max_model_len"  # the CPU default: what max_num_seqs and max_model_len can use
    PROFILED = "gpu_memory_utilization"  # CUDA: what the device has left after a profiling pass


@dataclass(frozen=True, slots=True)
class KVBudget:
    num_blocks: int  # including the null block
    sizing: KVSizing


def group_blocks(tokens: int, seqs: int, block_size: int, windows: Sequence[int], chunk: int) -> int:
    """Blocks `seqs` sequences holding `tokens` tokens in all take, summed over the KV groups
    (windows: per group, 0 for a global one): a windowed group's sequence holds at most the
    blocks of its window plus a chunk of `chunk` new tokens, and one more at a block edge."""
    full = -(-tokens // block_size)
    return sum(min(full, seqs * (-(-(w + chunk) // block_size) + 1)) if w else full for w in windows)


def kv_budget(cfg: EngineConfig, max_model_len: int, block_bytes: int, windows: Sequence[int] = (0,)) -> KVBudget:
    """Blocks for a cache no profiling pass sizes (block_bytes: K and V of one block, every layer
    slot; windows: per KV group)."""
    if cfg.kv_cache_memory is not None:
        return KVBudget(cfg.kv_cache_memory // block_bytes, KVSizing.CONFIGURED)
    if cfg.gpu_memory_utilization is not None:
        raise ValueError(
            "gpu_memory_utilization sizes the KV cache on CUDA devices only; on the CPU the cache is "
            "sized from max_model_len and max_num_seqs, or give kv_cache_memory (--kv-cache-memory)"
        )
    tokens = max(max_model_len, cfg.max_num_seqs * -(-max_model_len // MODEL_LEN_SHARE))
    # + the null block
    blocks = group_blocks(tokens, cfg.max_num_seqs, cfg.block_size, windows, cfg.max_num_batched_tokens) + 1
    return KVBudget(min(blocks, MAX_DEFAULT_CPU_BYTES // block_bytes), KVSizing.WORKLOAD)


def check_blocks(
    num_blocks: int, max_model_len: int, block_size: int, windows: Sequence[int] = (0,), chunk: int = 0
) -> None:
    """Refuse a cache in which one sequence of max_model_len tokens does not fit (chunk: the most
    new tokens of a step, what a windowed group holds beyond its window)."""
    need = group_blocks(max_model_len, 1, block_size, windows, chunk) + 1  # + the null block
    if num_blocks < need and len(windows) == 1:
        raise ValueError(
            f"the KV cache holds {max(num_blocks - 1, 0) * block_size} tokens, fewer than max_model_len="
            f"{max_model_len}: give a larger --kv-cache-memory or a smaller --max-model-len"
        )
    if num_blocks < need:
        raise ValueError(
            f"the KV cache holds {max(num_blocks - 1, 0)} blocks, fewer than the {need - 1} that one sequence of "
            f"max_model_len={max_model_len} tokens takes in the model's {len(windows)} KV groups: give a larger "
            "--kv-cache-memory or a smaller --max-model-len"
        )
