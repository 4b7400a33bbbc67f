"""Size the CUDA KV cache as vLLM does: run the largest step the engine may schedule on a small
cache, measure the peak memory it took (weights + activations), and give the KV cache what
gpu_memory_utilization leaves of the device after that."""

from __future__ import annotations

import torch

from traceless.config import EngineConfig
from traceless.model.layers.kv_cache import KVCache
from traceless.runner.batch import SeqInput
from traceless.runner.model_runner import ModelRunner

# Kept free for what the profile does not run: the decode graphs' pool, the sampler's sort of the
# logits, the cuBLAS workspaces of other shapes.
RESERVE_BYTES = 512 * 2**20


def profile_peak_bytes(runner: ModelRunner, cache: KVCache, cfg: EngineConfig) -> int:
    """Peak bytes allocated by torch during one forward over max_num_batched_tokens tokens (one
    fresh sequence, token id 0 everywhere) and the logits of max_num_seqs rows."""
    T = cfg.max_num_batched_tokens
    seq = profile_seq(T, cache.block_size, cache.groups.num_groups, min(T, cfg.max_num_seqs))
    torch.cuda.synchronize(runner.device)
    torch.cuda.reset_peak_memory_stats(runner.device)
    with torch.inference_mode():
        batch = runner.batcher.build([seq])
        hidden = runner.model.forward(batch.input_ids, batch.positions, batch.meta)
        logits = runner.model.logits(hidden[batch.logit_rows])
        logits.softmax(dim=-1).sort(dim=-1)  # what a top-p row costs the sampler
    torch.cuda.synchronize(runner.device)
    runner.batcher.scrub()
    peak = torch.cuda.max_memory_allocated(runner.device)
    del batch, hidden, logits
    return peak


def profile_seq(num_tokens: int, block_size: int, num_groups: int, logit_rows: int) -> SeqInput:
    """The profiled step: one fresh sequence of num_tokens tokens, each KV group its own blocks
    (1.. of the profiling cache, which holds num_groups tables of them)."""
    n = -(-num_tokens // block_size)
    tables = [list(range(1 + g * n, 1 + (g + 1) * n)) for g in range(num_groups)]
    return SeqInput(tables[0], 0, [0] * num_tokens, logit_rows, group_tables=tuple(tables[1:]))


def kv_blocks_after_profile(runner: ModelRunner, cache: KVCache, cfg: EngineConfig, block_bytes: int) -> int:
    """KV blocks that fit in total * gpu_memory_utilization after the profiled peak, the memory
    outside torch's allocator (CUDA context, libraries) and a fixed reserve."""
    peak = profile_peak_bytes(runner, cache, cfg)
    free, total = torch.cuda.mem_get_info(runner.device)
    outside_torch = max(0, (total - free) - torch.cuda.memory_reserved(runner.device))
    profile_cache = 2 * cache.k.numel() * cache.k.element_size()
    util = cfg.gpu_memory_utilization or 0.9
    budget = total * util - (peak - profile_cache) - outside_torch - RESERVE_BYTES
    return max(int(budget) // block_bytes, 0)
