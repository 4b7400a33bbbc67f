"""GGUF files whose tensors are K-quants load to the reference dequantizer's values, bit for bit,
and the model runs them: greedy tokens equal transformers' on the same (dequantized) weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import make_tiny_model
from tests.model.gguf_helpers import GGUFSpec, Hyper, byte_level_vocab, hf_state, to_hf_names, write_gguf
from tests.support.ggml_raw import random_tensor
from traceless import LLM, SamplingParams
from traceless.model.gguf_loader import load_gguf

K_QUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama whose ffn_down rows (intermediate 256) are whole K-quant super-blocks."""
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("hf-llama")
    make_tiny_model(path, "llama", seed=3, intermediate_size=256)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, Hyper.from_hf(json.loads((path / "config.json").read_text()), "llama")


def _write(tiny, path: Path, fmt: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every ffn_down as random `fmt` blocks (scales sized like the model's weights), the rest Q8_0.
    Returns (expected canonical weights, raw ffn_down bytes by canonical name)."""
    from gguf import GGMLQuantizationType, quants

    model, hyper = tiny
    rng = np.random.default_rng(5)
    replace, raws = {}, {}
    for layer in range(hyper.n_layer):
        raw = random_tensor(fmt, hyper.n_embd, hyper.n_ff, rng, scale=0.05)
        replace[f"blk.{layer}.ffn_down.weight"] = (raw, GGMLQuantizationType[fmt])
        raws[f"layers.{layer}.down"] = raw
    spec = GGUFSpec(
        hyper, hf_state(model), GGMLQuantizationType.Q8_0, byte_level_vocab(hyper.vocab_size), replace=replace
    )
    expected = write_gguf(path, spec)
    for name, raw in raws.items():
        expected[name] = np.asarray(quants.dequantize(raw, GGMLQuantizationType[fmt]), dtype=np.float32)
    return expected, raws


@pytest.mark.parametrize("fmt", K_QUANTS)
def test_k_quant_tensors_load_to_the_reference_values(tiny, tmp_path, fmt):
    path = tmp_path / f"tiny-{fmt}.gguf"
    expected, raws = _write(tiny, path, fmt)
    _, weights, _ = load_gguf(path, torch.float32)
    for name in raws:
        got = weights[name].numpy()
        assert got.shape == (64, 256)
        assert np.array_equal(got.view(np.uint32), expected[name].view(np.uint32)), name


@pytest.mark.parametrize("fmt", ["Q4_K", "Q6_K"])
def test_k_quant_model_generates_like_transformers(tiny, tmp_path, fmt):
    import copy

    torch.set_num_threads(1)
    path = tmp_path / f"tiny-{fmt}.gguf"
    expected, _ = _write(tiny, path, fmt)
    clone = copy.deepcopy(tiny[0])
    clone.load_state_dict({k: torch.from_numpy(v) for k, v in to_hf_names(expected).items()}, strict=True)
    prompts = [[5, 9, 200], [17, 300, 42, 8, 99, 250, 3]]
    with torch.no_grad():
        want = [
            clone.generate(
                torch.tensor([p]),
                max_new_tokens=8,
                min_new_tokens=8,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )[0, len(p) :].tolist()
            for p in prompts
        ]
    llm = LLM(str(path), dtype="float32", kv_cache_memory=8 * 2**20)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
        use_tqdm=False,
    )
    assert [list(o.outputs[0].token_ids) for o in outs] == want
