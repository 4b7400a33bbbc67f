"""The KV cache's size where no profiling pass sets it: on the CPU, by default, what the
configuration can use (not a fixed 2 GiB: `make run` once held 6.2 GB for a 135M model); the
engine says at start what it chose; gpu_memory_utilization is refused on the CPU."""

from __future__ import annotations

import pytest

from traceless.config import DEFAULT_CPU_KV_BYTES, EngineConfig
from traceless.runner.kv_budget import MODEL_LEN_SHARE, KVSizing, check_blocks, kv_budget

SMOLLM2_TOKEN_BYTES = 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 KV heads of 64, bfloat16


def test_the_default_cpu_cache_holds_what_max_num_seqs_and_max_model_len_can_use():
    block = 16 * SMOLLM2_TOKEN_BYTES
    budget = kv_budget(EngineConfig(), 8192, block)  # the built-in model's defaults
    assert budget.sizing is KVSizing.WORKLOAD
    assert budget.num_blocks == 128 * (8192 // MODEL_LEN_SHARE) // 16 + 1  # 32,768 tokens + the null block
    assert budget.num_blocks * block < DEFAULT_CPU_KV_BYTES / 2.5  # 0.7 GiB where 2 GiB were taken
    few = kv_budget(EngineConfig(max_num_seqs=2), 8192, block)
    assert few.num_blocks == 8192 // 16 + 1  # never less than one full-length sequence
    check_blocks(few.num_blocks, 8192, 16)


def test_the_default_is_bounded_and_a_given_size_is_kept():
    block = 16 * SMOLLM2_TOKEN_BYTES
    assert kv_budget(EngineConfig(max_num_seqs=1024), 131072, block).num_blocks == DEFAULT_CPU_KV_BYTES // block
    given = kv_budget(EngineConfig(kv_cache_memory=100 * block), 8192, block)
    assert given == type(given)(100, KVSizing.CONFIGURED)
    with pytest.raises(ValueError, match="--kv-cache-memory or a smaller --max-model-len"):
        check_blocks(given.num_blocks, 8192, 16)


def test_gpu_memory_utilization_is_refused_on_the_cpu():
    with pytest.raises(ValueError, match="CUDA devices only.*kv_cache_memory"):
        kv_budget(EngineConfig(gpu_memory_utilization=0.5), 8192, 16 * SMOLLM2_TOKEN_BYTES)


def test_an_engine_says_how_big_its_cache_is_and_why(tiny_llama_dir, captured_events):
    from traceless import LLM

    llm = LLM(str(tiny_llama_dir), dtype="float32", device="cpu")  # no size given: the CPU default
    ready = next(e for e in captured_events() if e["event"] == "engine.ready")
    token_bytes = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads of 16, float32
    tokens = max(256, 128 * 256 // MODEL_LEN_SHARE)
    assert ready["num_blocks"] == llm.engine.num_kv_blocks == tokens // 16 + 1  # was 2 GiB: 262,144 blocks
    assert ready["kv_cache_bytes"] == ready["num_blocks"] * 16 * token_bytes
    assert ready["kv_sized_by"] == "max_model_len"
    with pytest.raises(ValueError, match="CUDA devices only"):
        LLM(str(tiny_llama_dir), dtype="float32", device="cpu", gpu_memory_utilization=0.5)


def test_windowed_kv_groups_are_counted_at_their_window():
    """One global and two local groups (window 32): a local group's sequence holds its window and a
    64-token chunk (6 blocks of 16) and one more, not the whole context."""
    block = 16 * 2**10
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=16)
    budget = kv_budget(cfg, 1024, block, windows=(0, 32, 32))
    assert budget.num_blocks == 64 + 2 * 4 * 7 + 1  # global: 1024 tokens; local: 4 sequences x 7
    check_blocks(64 + 2 * 7 + 1, 1024, 16, (0, 32, 32), 64)
    with pytest.raises(ValueError, match="3 KV groups"):
        check_blocks(64 + 2 * 7, 1024, 16, (0, 32, 32), 64)


def test_the_cuda_profiling_step_gives_every_kv_group_its_own_blocks():
    from traceless.runner.gpu_memory import profile_seq

    seq = profile_seq(100, 16, 3, 8)  # 7 blocks per group; the profiling cache has 3 x 7 + 1
    tables = [seq.table, *seq.group_tables]
    assert [len(t) for t in tables] == [7, 7, 7] and len(seq.token_ids) == 100 and seq.num_logits == 8
    ids = [b for t in tables for b in t]
    assert sorted(ids) == list(range(1, 22))  # distinct, never the null block, inside the cache
