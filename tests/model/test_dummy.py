"""--load-format dummy: real shapes from the bench/models configs, seeded weights, a synthetic
tokenizer, and a model marked dummy wherever it is reported."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from traceless import LLM, SamplingParams
from traceless.config import EngineConfig
from traceless.errors import ModelLoadError
from traceless.events import LOGGER_NAME
from traceless.model.dummy import dummy_weights, read_dummy_config, synthetic_tokenizer, weight_shapes
from traceless.model.hf_config import from_hf_config

MODELS = Path(__file__).resolve().parents[2] / "bench" / "models"
PUBLISHED = {  # (layers, hidden, intermediate, heads, kv heads, vocab, tied, qkv bias, parameters in billions)
    "llama-3.1-8b": (32, 4096, 14336, 32, 8, 128256, False, False, 8.03),
    "llama-3.2-1b": (16, 2048, 8192, 32, 8, 128256, True, False, 1.24),
    "qwen2.5-7b": (28, 3584, 18944, 28, 4, 152064, False, True, 7.62),
    "qwen3-8b": (36, 4096, 12288, 32, 8, 151936, False, False, 8.19),
    "gemma-3-12b": (48, 3840, 15360, 16, 8, 262208, True, False, 11.77),  # the text model
    "phi-3-medium-128k-instruct": (40, 5120, 17920, 40, 10, 32064, False, False, 13.96),
    "phi-4": (40, 5120, 17920, 40, 10, 100352, False, False, 14.66),
    "mistral-small-24b": (40, 5120, 32768, 32, 8, 131072, False, False, 23.57),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_bench_model_configs_have_the_published_shapes(name):
    c = read_dummy_config(MODELS / name)
    layers, hidden, inter, heads, kv, vocab, tied, bias, billions = PUBLISHED[name]
    assert (
        c.num_layers,
        c.hidden_size,
        c.intermediate_size,
        c.num_heads,
        c.num_kv_heads,
        c.vocab_size,
        c.tie_word_embeddings,
        c.qkv_bias,
    ) == (layers, hidden, inter, heads, kv, vocab, tied, bias)
    params = sum(torch.Size(s).numel() for s in weight_shapes(c).values())
    assert abs(params / 1e9 - billions) < 0.01


def _tiny_config(tmp_path: Path, **over) -> Path:
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        **over,
    }
    folder = tmp_path / "tiny-dummy"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def test_dummy_weights_are_seeded_and_of_sane_scale(tmp_path):
    c = from_hf_config(json.loads((_tiny_config(tmp_path) / "config.json").read_text()))
    a = dummy_weights(c, torch.float32, torch.device("cpu"), seed=3)
    b = dummy_weights(c, torch.float32, torch.device("cpu"), seed=3)
    other = dummy_weights(c, torch.float32, torch.device("cpu"), seed=4)
    assert a.keys() == b.keys() == weight_shapes(c).keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["layers.0.q"], other["layers.0.q"])
    assert abs(float(a["layers.0.down"].std()) - 128**-0.5) < 0.02  # 1 / sqrt(fan_in)
    assert torch.equal(a["norm"], torch.ones(64))


def test_synthetic_tokenizer_round_trips_bytes_and_decodes_every_id():
    tok = synthetic_tokenizer(1000)
    assert tok.vocab_size == 1000
    text = "héllo, wörld\n"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode([300, 999]) == " w300"  # 999: the end-of-text token, skipped as special
    assert tok.eos_ids == frozenset({999})
    with pytest.raises(ModelLoadError):
        synthetic_tokenizer(100)


def test_a_dummy_model_generates_and_is_marked_dummy(tmp_path, caplog):
    folder = _tiny_config(tmp_path)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        llm = LLM(str(folder), dtype="float32", device="cpu", load_format="dummy", kv_cache_memory=2**20)
    assert llm.engine.model.load_format == "dummy"
    ready = [json.loads(r.getMessage()) for r in caplog.records if '"engine.ready"' in r.getMessage()]
    assert ready and ready[-1]["load_format"] == "dummy"
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    first = llm.generate([{"prompt_token_ids": [5, 6, 7]}], params, use_tqdm=False)[0].outputs[0]
    again = LLM(str(folder), dtype="float32", device="cpu", load_format="dummy", kv_cache_memory=2**20)
    second = again.generate([{"prompt_token_ids": [5, 6, 7]}], params, use_tqdm=False)[0].outputs[0]
    assert len(first.token_ids) == 8 and first.token_ids == second.token_ids
    assert len(set(first.token_ids)) > 1  # the weights are not degenerate
    assert isinstance(first.text, str)
    llm.engine.check_integrity()


def test_dummy_needs_a_config_and_a_known_format(tmp_path):
    with pytest.raises(ModelLoadError):
        LLM(str(tmp_path), device="cpu", load_format="dummy", kv_cache_memory=2**20)  # no config.json
    with pytest.raises(ValueError, match="load_format"):
        EngineConfig(load_format="random")


@pytest.mark.parametrize("arch", ["Gemma3ForCausalLM", "Phi3ForCausalLM", "Qwen3ForCausalLM"])
def test_a_dummy_model_of_each_new_family_generates(tmp_path, arch):
    """Their extra tensors (q/k norms, post norms) are drawn; Gemma's norms come out as ones applied."""
    folder = _tiny_config(
        tmp_path,
        architectures=[arch],
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )
    c = read_dummy_config(folder)
    weights = dummy_weights(c, torch.float32, torch.device("cpu"))
    if c.qk_norm:
        assert "layers.1.q_norm" in weights
    if c.sandwich_norms:
        assert torch.equal(weights["layers.0.post_mlp_norm"] + c.norm_offset, torch.ones(64))
    llm = LLM(str(folder), dtype="float32", device="cpu", load_format="dummy", kv_cache_memory=2**20)
    out = llm.generate(
        [{"prompt_token_ids": list(range(5, 25))}],
        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert len(out.token_ids) == 6
    llm.engine.check_integrity()


@pytest.mark.parametrize(
    ("name", "billions"),
    [("mixtral-8x7b", 46.70), ("qwen3-30b-a3b", 30.53), ("gpt-oss-20b", 20.91), ("llama-3.1-70b", 70.55)],
)
def test_the_dummy_shapes_of_the_moe_and_70b_configs_count_the_published_parameters(name, billions):
    c = read_dummy_config(MODELS / name)
    params = sum(torch.Size(s).numel() for s in weight_shapes(c).values())
    assert abs(params / 1e9 - billions) < 0.01


def test_lazy_dummy_weights_are_the_same_in_any_order(tmp_path):
    """The loader draws each tensor when the decoder takes it: the order must not change them."""
    from traceless.model.dummy import lazy_dummy_weights

    c = from_hf_config(json.loads((_tiny_config(tmp_path) / "config.json").read_text()))
    eager = dummy_weights(c, torch.float32, torch.device("cpu"), seed=3)
    lazy = lazy_dummy_weights(c, torch.float32, torch.device("cpu"), seed=3)
    for name in reversed(list(eager)):
        assert torch.equal(lazy.pop(name), eager[name]), name
    assert len(lazy) == 0


@pytest.mark.parametrize("arch", ["MixtralForCausalLM", "Qwen3MoeForCausalLM"])
def test_a_dummy_mixture_of_experts_generates(tmp_path, arch):
    folder = _tiny_config(
        tmp_path,
        architectures=[arch],
        num_local_experts=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        mlp_only_layers=[1],
    )
    c = read_dummy_config(folder)
    shapes = weight_shapes(c)
    E = 4 if arch.startswith("Mixtral") else 8
    inter = 128 if arch.startswith("Mixtral") else 32
    assert shapes["layers.0.experts.gate_up"] == (E, 2 * inter, 64) and shapes["layers.0.router"] == (E, 64)
    # Qwen3-MoE's mlp_only_layers keep a dense MLP; Mixtral has no such field
    assert ("layers.1.gate" in shapes) == arch.startswith("Qwen3")
    llm = LLM(str(folder), dtype="float32", device="cpu", load_format="dummy", kv_cache_memory=2**20)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": list(range(5, 25))}], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 6 and len(set(out.token_ids)) > 1
    llm.engine.check_integrity()
