"""--quantization fp8: a checkpoint's (or dummy weights') layer matrices quantized to FP8 at load,
per output channel, activations per token. FP8 matmuls run on CUDA only, so on the CPU the flag
is refused; the tests below build the CUDA decoder on the CPU (the engine's format resolution
patched to say FP8), where Fp8Linear emulates the FP8 arithmetic, and check which matrices become
FP8 and how close the model stays to the dense one. The bench/models configs are too large to
load here: their FP8 dummy path is checked on tiny configs of the same architectures, and the
large configs are checked to parse. The real FP8 matmuls are the gpu-marked test."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tests.support.families import make_family_model
from tests.support.fp8_agreement import top1_agreement
from traceless import LLM, SamplingParams
from traceless.model.dummy import read_dummy_config
from traceless.model.fp8.linear import Fp8Linear
from traceless.model.llama import ExpertsMLP
from traceless.model.quantization import Quantization
from traceless.modes import QuantizationMode
from traceless.runner import build

MODELS = Path(__file__).resolve().parents[3] / "bench" / "models"


def _prompts(seed: str, lengths) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 384) for _ in range(n)] for n in lengths]


@pytest.fixture
def as_on_cuda(monkeypatch):
    """The engine resolves quantization fp8 as it does on CUDA (the decoder stays on the CPU)."""
    resolve = build._quantization

    def fp8_as_on_cuda(cfg, device):
        return Quantization.FP8 if cfg.quantization is QuantizationMode.FP8 else resolve(cfg, device)

    monkeypatch.setattr(build, "_quantization", fp8_as_on_cuda)
    monkeypatch.setattr(
        build, "_keep_fp8", lambda cfg, device: cfg.quantization in (QuantizationMode.AUTO, QuantizationMode.FP8)
    )


def _layer_linears(model) -> list:
    out = []
    for layer in model.layers:
        out += [layer.qkv, layer.o]
        if not isinstance(layer.mlp, ExpertsMLP):
            out += [layer.mlp.gate_up, layer.mlp.down]
    return out


def test_quantization_fp8_quantizes_a_dense_checkpoint_at_load(tmp_path, as_on_cuda):
    """Every layer matrix becomes FP8 (not the embedding or the output head); greedy next-token
    agreement with the dense model where the dense model's best token leads by > 2 nats: FP8
    weights and activations (3 mantissa bits) move a log-probability by up to ~3 nats here (the
    tiny model's logits are ~+-20; a garbled model moves them by tens), so nearer choices may swap."""
    path = make_family_model(tmp_path / "mistral", "mistral", seed=6)
    dense = LLM(str(path), dtype="float32", kv_cache_memory=4 * 2**20)
    fp8 = LLM(str(path), dtype="float32", kv_cache_memory=4 * 2**20, quantization="fp8")
    model = fp8.engine._executor.model
    assert all(isinstance(lin, Fp8Linear) for lin in _layer_linears(model))
    assert not isinstance(model.lm_head, Fp8Linear)
    assert fp8.engine.model.quantization == "fp8"
    got = top1_agreement(fp8, dense, _prompts("at-load", (5, 9, 13, 17)), 40, margin=2.0)
    assert got.decisive >= 40 and got.top1 >= 0.97 and got.max_gap < 4.0, got


def _tiny_config(tmp_path: Path, **fields) -> Path:
    config = (
        dict(
            architectures=["LlamaForCausalLM"],
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )
        | fields
    )
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


# tiny configs of the bench/models architectures (Llama-3.1-70B, Mixtral-8x7B, Qwen3-30B-A3B)
TINY = {
    "llama": {},
    "mixtral": dict(architectures=["MixtralForCausalLM"], num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(
        architectures=["Qwen3MoeForCausalLM"],
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        head_dim=16,
        norm_topk_prob=True,
    ),
}


@pytest.mark.parametrize("kind", list(TINY))
def test_dummy_weights_with_quantization_fp8_generate(kind, tmp_path, as_on_cuda):
    folder = _tiny_config(tmp_path, **TINY[kind])
    llm = LLM(str(folder), dtype="float32", load_format="dummy", quantization="fp8", kv_cache_memory=2**20)
    model = llm.engine._executor.model
    assert all(isinstance(lin, Fp8Linear) for lin in _layer_linears(model))
    assert any(isinstance(layer.mlp, ExpertsMLP) for layer in model.layers) == (kind != "llama")
    assert llm.engine.model.quantization == "fp8" and llm.engine.model.load_format == "dummy"
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": list(range(5, 25))}], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 6
    llm.engine.check_integrity()


def test_dummy_weights_of_an_fp8_config_are_fp8_under_auto(tmp_path, as_on_cuda):
    """A config that carries an FP8 quantization_config: its dummy weights cost what the FP8
    checkpoint would (quantized at load without --quantization fp8)."""
    folder = _tiny_config(tmp_path, quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"})
    llm = LLM(str(folder), dtype="float32", load_format="dummy", kv_cache_memory=2**20)
    assert all(isinstance(lin, Fp8Linear) for lin in _layer_linears(llm.engine._executor.model))
    assert llm.engine.model.quantization == "fp8"


@pytest.mark.parametrize("name", ["llama-3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b"])
def test_the_large_bench_configs_parse_for_the_fp8_dummy_path(name):
    c = read_dummy_config(MODELS / name)
    assert c.fp8 is None  # bf16 checkpoints: FP8 only with --quantization fp8
    assert (c.moe is not None) == (name != "llama-3.1-70b")
    # the FP8 matmul (torch._scaled_mm) needs K and N multiples of 16 in every layer matrix
    assert c.hidden_size % 16 == 0 and c.intermediate_size % 16 == 0 and c.head_dim % 16 == 0


def test_an_fp8_checkpoint_is_not_quantized_twice(tmp_path):
    from tests.support.fp8_checkpoint import write_fp8_checkpoint

    src = make_family_model(tmp_path / "llama", "mistral", seed=3)
    fp8, _ = write_fp8_checkpoint(src, tmp_path / "q", "fp8-dynamic")
    with pytest.raises(ValueError, match="FP8 already"):
        LLM(str(fp8), kv_cache_memory=2**20, quantization="q8_0")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (FP8 matmuls: Hopper or later)")
@pytest.mark.parametrize("kind", list(TINY))
def test_dummy_fp8_on_the_gpu_runs_fp8_matmuls(kind, tmp_path):
    folder = _tiny_config(tmp_path, **TINY[kind])
    llm = LLM(
        str(folder),
        dtype="bfloat16",
        device="cuda",
        load_format="dummy",
        quantization="fp8",
        kv_cache_memory=16 * 2**20,
        max_model_len=128,
    )
    assert all(isinstance(lin, Fp8Linear) for lin in _layer_linears(llm.engine._executor.model))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": list(range(5, 25))}], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 8
