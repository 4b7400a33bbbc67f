"""A Gemma 3-shaped model (five local layers with a 32-token window to one global layer): its local
layers' KV stays window-sized over a long generation while the global layer's grows, prefix hits
and chunked prefill work across the window's edge, and every output equals transformers'."""

from __future__ import annotations

import random

import pytest
import torch

from tests.support.families import hf_greedy, hf_model, make_family_model, ours
from traceless import LLM, SamplingParams
from traceless.model.layers.kv_cache import block_bytes

WINDOW = 32
TYPES = ["sliding_attention"] * 5 + ["full_attention"]


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    return make_family_model(
        tmp_path_factory.mktemp("gemma3-hybrid"),
        "gemma3",
        seed=5,
        num_hidden_layers=6,
        layer_types=TYPES,
        sliding_window=WINDOW,
        max_position_embeddings=1024,
        head_dim=16,
        query_pre_attn_scalar=16,
    )


def _block_bytes(path, block_size: int) -> int:
    from traceless.model.hf_config import from_hf_config
    from traceless.model.hf_loader import read_json

    return block_bytes(from_hf_config(read_json(path / "config.json")), block_size, torch.float32)


def test_local_layers_hold_window_sized_kv_over_a_long_generation(gemma3_dir):
    block, new_tokens = 16, 600
    prompt = [random.Random(3).randrange(3, 384) for _ in range(40)]  # longer than the window
    want = hf_greedy(hf_model(gemma3_dir), prompt, new_tokens)
    # 80 one-layer blocks: the global layer's 40 and 4 for each local group, with room for a
    # 64-token chunk (what the engine checks at start); keeping every layer's blocks takes 6 x 40
    llm = LLM(
        str(gemma3_dir),
        dtype="float32",
        kv_cache_memory=80 * _block_bytes(gemma3_dir, block),
        max_model_len=640,
        max_num_batched_tokens=64,
        block_size=block,
    )
    engine = llm.engine
    assert engine.model.kv_windows == (0,) + (WINDOW,) * 5
    engine.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True))
    got: list[int] = []
    most_local, last = 0, [0]
    while engine.has_unfinished():
        for out in engine.step():
            got += out.new_token_ids
        counts = engine.kv_group_blocks()
        if counts[0]:
            last = counts
            most_local = max(most_local, *counts[1:])
    assert got == want
    assert last[0] == -(-(40 + new_tokens - 1) // block)  # the global layer keeps every block
    # the window's 32 keys span at most 3 blocks, plus the block being written
    assert most_local <= WINDOW // block + 2
    assert engine.kv_stats().preemptions == 0
    engine.check_integrity()


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_prefix_hits_and_chunked_prefill_across_the_window_edge(gemma3_dir, backend):
    """A long request's local blocks behind its window were freed while it ran (they stay cached
    until evicted); later requests sharing 40 or 64 of its tokens hit across the window's edge and
    are prefilled in chunks of 24 tokens, in one batch; block size 4 puts the edge inside blocks."""
    rng = random.Random(backend)
    base = [rng.randrange(3, 384) for _ in range(72)]
    prompts = [
        base[:40] + [rng.randrange(3, 384) for _ in range(7)],
        base[:64] + [5, 9, 11],
        base[:20] + [rng.randrange(3, 384) for _ in range(30)],
    ]
    hf = hf_model(gemma3_dir)
    want_base = hf_greedy(hf, base, 8)
    want = [hf_greedy(hf, p, 12) for p in prompts]
    llm = LLM(
        str(gemma3_dir),
        dtype="float32",
        block_size=4,
        kv_cache_memory=600 * _block_bytes(gemma3_dir, 4),
        max_num_batched_tokens=24,
        prefix_cache="global",
        max_model_len=256,
        attention_backend=backend,
    )
    assert ours(llm, [base], 8, batched=False) == [want_base]
    assert llm.engine.cached_prefix_len(prompts[0]) == 40 and llm.engine.cached_prefix_len(prompts[1]) == 64
    assert ours(llm, prompts, 12, batched=True) == want
    assert ours(llm, prompts[1:2], 12, batched=False) == want[1:2]  # alone as in the batch
    llm.engine.drop_prefix_cache()
    llm.engine.check_integrity()


def test_preemption_by_swapping_restores_every_groups_kv(gemma3_dir):
    """Too few blocks for four requests' global tables at once: requests are preempted, their live
    blocks of every group sealed and restored (encrypted offload), and the outputs still match."""
    rng = random.Random("swap")
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (50, 38, 61, 45)]
    hf = hf_model(gemma3_dir)
    want = [hf_greedy(hf, p, 24) for p in prompts]
    llm = LLM(
        str(gemma3_dir),
        dtype="float32",
        block_size=4,
        kv_cache_memory=120 * _block_bytes(gemma3_dir, 4),
        max_num_batched_tokens=32,
        max_model_len=96,
        kv_offload="memory",
    )
    assert ours(llm, prompts, 24, batched=True) == want
    stats = llm.engine.kv_stats()
    assert stats.preemptions > 0 and stats.offload_bytes_in == stats.offload_bytes_out > 0
    llm.engine.check_integrity()


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_speculative_decoding_writes_and_reads_every_groups_blocks(gemma3_dir, mode):
    """Drafts verified past the window (prompt lookup), or made by the first layers (self-speculation,
    whose local layers write their own group's blocks): greedy output unchanged."""
    rng = random.Random(mode)
    motif = [rng.randrange(3, 384) for _ in range(6)]
    prompts = [motif * 8, [rng.randrange(3, 384) for _ in range(45)]]  # repeats give prompt lookup drafts
    hf = hf_model(gemma3_dir)
    want = [hf_greedy(hf, p, 20) for p in prompts]
    llm = LLM(
        str(gemma3_dir),
        dtype="float32",
        block_size=4,
        kv_cache_memory=400 * _block_bytes(gemma3_dir, 4),
        max_model_len=128,
        speculative=mode,
        num_speculative_tokens=3,
        draft_layers=2 if mode == "draft" else None,
    )
    assert ours(llm, prompts, 20, batched=True) == want
    assert llm.engine.spec_stats.proposed > 0
    llm.engine.check_integrity()


def test_async_scheduling_runs_ahead_across_the_window_edge(gemma3_dir):
    """Steps launched before the last one's tokens are read allocate every group's blocks ahead and
    free the local ones after: greedy output unchanged."""
    rng = random.Random("ahead")
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (20, 33, 47)]
    hf = hf_model(gemma3_dir)
    want = [hf_greedy(hf, p, 30) for p in prompts]
    llm = LLM(
        str(gemma3_dir),
        dtype="float32",
        block_size=4,
        kv_cache_memory=400 * _block_bytes(gemma3_dir, 4),
        max_model_len=128,
        async_scheduling=True,
    )
    assert ours(llm, prompts, 30, batched=True) == want
    llm.engine.check_integrity()
