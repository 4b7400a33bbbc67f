"""A windowed model's long generation runs in window-sized KV memory and still equals transformers."""

from __future__ import annotations

import random

import torch

from tests.support.families import hf_greedy, make_family_model
from traceless import LLM, SamplingParams
from traceless.model.layers.kv_cache import block_bytes

WINDOW, BLOCK, NEW_TOKENS = 32, 16, 2000


def test_mistral_window_keeps_its_blocks_bounded_over_a_long_generation(tmp_path):
    from transformers import AutoModelForCausalLM

    from traceless.model.hf_config import from_hf_config
    from traceless.model.hf_loader import read_json

    path = make_family_model(tmp_path / "m", "mistral", seed=11, sliding_window=WINDOW, max_position_embeddings=4096)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompt = [random.Random(3).randrange(3, 384) for _ in range(40)]  # longer than the window
    want = hf_greedy(hf, prompt, NEW_TOKENS)

    num_blocks = 160  # room for all 2,040 tokens (128 blocks): only the freeing keeps usage down
    memory = num_blocks * block_bytes(from_hf_config(read_json(path / "config.json")), BLOCK, torch.float32)
    llm = LLM(str(path), dtype="float32", kv_cache_memory=memory, max_model_len=2048, block_size=BLOCK)
    engine = llm.engine
    engine.add_request("r", prompt, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True))
    got: list[int] = []
    most = 0
    while engine.has_unfinished():
        for out in engine.step():
            got += out.new_token_ids
        most = max(most, round(engine.kv_stats().usage * (num_blocks - 1)))
    assert got == want
    # prefill of 40 tokens: 3 blocks; decoding: the window's 32 keys span at most 3 blocks, plus
    # the block being written
    assert most <= WINDOW // BLOCK + 2
    engine.check_integrity()
