"""Greedy float32 outputs equal Hugging Face transformers on the same weights."""

from __future__ import annotations

import random

import pytest
import torch

from tests.support.families import LLAMA3_SCALING, hf_greedy, ours
from tests.support.prompts import CHAT_PROMPTS
from traceless import LLM


@pytest.fixture(scope="module")
def tiny_llama3_dir(tmp_path_factory):
    from tests.conftest import make_tiny_model

    # llama3 RoPE scaling with a short original context, so the prompts below cross its wavelengths
    return make_tiny_model(
        tmp_path_factory.mktemp("tiny-llama3"), "llama", seed=2, rope_scaling=LLAMA3_SCALING, rope_theta=500000.0
    )


@pytest.fixture(scope="module")
def tiny_mistral_dir(tmp_path_factory):
    from tests.conftest import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-mistral"), "mistral", seed=3, sliding_window=None)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "llama3", "mistral"])
def test_tiny_models_match_transformers(kind, tiny_llama_dir, tiny_qwen2_dir, tiny_llama3_dir, tiny_mistral_dir):
    from transformers import AutoModelForCausalLM

    path = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir, "llama3": tiny_llama3_dir, "mistral": tiny_mistral_dir}[
        kind
    ]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rng = random.Random(kind)
    # varied lengths: single token, a partial block, several blocks, one long enough to chunk
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (1, 5, 16, 17, 40, 100)]
    want = [hf_greedy(hf, p, 24) for p in prompts]
    # a small token budget forces chunked prefill mixed with decodes
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 * 2**20, max_num_batched_tokens=48)
    assert ours(llm, prompts, 24, batched=True) == want
    assert ours(llm, prompts, 24, batched=False) == want
    llm.engine.check_integrity()


def test_llama3_scaling_is_parsed_and_changes_frequencies(tiny_llama3_dir):
    from traceless.model.hf_config import from_hf_config
    from traceless.model.hf_loader import read_json
    from traceless.model.rope import inv_frequencies

    config = from_hf_config(read_json(tiny_llama3_dir / "config.json"))
    assert config.rope_scaling is not None and config.rope_scaling.kind == "llama3"
    from dataclasses import replace

    assert not torch.equal(inv_frequencies(config), inv_frequencies(replace(config, rope_scaling=None)))


def test_qwen2_biases_are_used(tiny_qwen2_dir):
    """The tiny Qwen2 has q/k/v biases; dropping them must change the output (so the parity test
    above really exercises them)."""
    from traceless.model.hf_loader import load_hf_dir

    config, weights = load_hf_dir(tiny_qwen2_dir, torch.float32)
    assert config.qkv_bias and "layers.0.q_bias" in weights
    assert float(weights["layers.0.q_bias"].abs().sum()) > 0


PROMPTS = CHAT_PROMPTS


@pytest.mark.slow
def test_default_model_matches_transformers(real_llm, hf_default_model_dir):
    from transformers import AutoModelForCausalLM

    # transformers dequantizes the GGUF itself (its own converter): an independent reading of the file
    hf = AutoModelForCausalLM.from_pretrained(hf_default_model_dir, dtype=torch.float32).eval()
    tok = real_llm.get_tokenizer()
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False)
        for p in PROMPTS[::2]
    ]  # five chat prompts of ten (every one costs a transformers generate)
    prompts += [tok.encode("The history of the printing press"), tok.encode("def fibonacci(n):")]
    want = [hf_greedy(hf, p, 48) for p in prompts]
    assert ours(real_llm, prompts, 48, batched=True) == want
    assert ours(real_llm, prompts[:3], 48, batched=False) == want[:3]  # alone, as well as in the batch
    real_llm.engine.check_integrity()
