"""FP8 checkpoints through the loader and the decoder.

On the CPU every FP8 weight is dequantized at load: the model equals, greedily, transformers
running the reference dequantization of the same bytes (tests/support/fp8.py decodes e4m3 bit by
bit). On CUDA the Linears an FP8 checkpoint stores in FP8 become Fp8Linear: which ones is
decided by the loader and the decoder, checked here on the CPU (Fp8Linear emulates the FP8
matmul there). The FP8 matmul's numerics on a GPU are the test marked gpu."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import make_tiny_model
from tests.support.families import hf_greedy, make_family_model, ours
from tests.support.fp8_checkpoint import FORMS, write_fp8_checkpoint
from traceless import LLM
from traceless.errors import UnsupportedModelError
from traceless.model.fp8.linear import Fp8Linear


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _prompts(seed: str, lengths=(1, 7, 20)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 384) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("llama"), seed=5)


@pytest.fixture(scope="module")
def peaked_dir(tmp_path_factory):
    """Logits of ~+-20 (tests/support/families.py): most greedy choices lead by a wide margin."""
    return make_family_model(tmp_path_factory.mktemp("mistral"), "mistral", seed=6)


@pytest.mark.parametrize("form", list(FORMS))
def test_the_cpu_dequantizes_fp8_checkpoints_like_the_reference(form, dense_dir, tmp_path):
    fp8, reference = write_fp8_checkpoint(dense_dir, tmp_path, form, ignore=("layers.1.mlp.down_proj",))
    prompts = _prompts(form)
    hf = _hf(reference)
    want = [hf_greedy(hf, p, 12) for p in prompts]
    llm = LLM(str(fp8), dtype="float32", kv_cache_memory=4 * 2**20)
    assert ours(llm, prompts, 12, batched=True) == want


def test_an_fp8_mixture_of_experts_checkpoint_dequantizes_its_experts(tmp_path):
    src = make_family_model(tmp_path / "mixtral", "mixtral", seed=4)
    fp8, reference = write_fp8_checkpoint(src, tmp_path / "q", "fp8-block")
    prompts = _prompts("moe")
    hf = _hf(reference)
    want = [hf_greedy(hf, p, 12) for p in prompts]
    assert ours(LLM(str(fp8), dtype="float32", kv_cache_memory=4 * 2**20), prompts, 12, batched=True) == want


@pytest.mark.parametrize(
    ("quant", "field"),
    [
        ({"quant_method": "gptq", "bits": 4}, "quant_method"),
        ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}, "activation_scheme"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic", "kv_cache_quant": True}, "kv_cache_quant"),
        ({"quant_method": "mxfp4"}, "mxfp4"),
    ],
)
def test_a_quantization_config_we_do_not_read_is_refused_naming_the_field(quant, field, dense_dir, tmp_path):
    for f in dense_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((dense_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"quantization_config": quant}))
    for load_format in ("auto", "dummy"):
        with pytest.raises(UnsupportedModelError, match=field):
            LLM(str(tmp_path), dtype="float32", kv_cache_memory=4 * 2**20, load_format=load_format)


def test_quantization_fp8_is_refused_on_the_cpu(dense_dir):
    for load_format in ("auto", "dummy"):
        with pytest.raises(ValueError, match="CUDA"):
            LLM(str(dense_dir), dtype="float32", kv_cache_memory=4 * 2**20, quantization="fp8", load_format=load_format)


def _kept_fp8_model(path):
    """The decoder as CUDA builds it (the checkpoint's FP8 Linears kept), built on the CPU."""
    from traceless.model.hf_loader import load_hf_dir
    from traceless.model.llama import LlamaModel

    config, weights = load_hf_dir(path, torch.float32, keep_fp8=True)
    no_ops = SimpleNamespace(silu_mul=None, gelu_tanh_mul=None)  # built, never run
    return LlamaModel(config, weights, None, no_ops, torch.device("cpu"), False)


def test_the_linears_the_checkpoint_quantizes_become_fp8_linears(dense_dir, tmp_path):
    ignore = ("model.layers.1.self_attn.o_proj", "model.layers.0.mlp.down_proj")
    fp8, _ = write_fp8_checkpoint(dense_dir, tmp_path, "fp8-static", ignore=ignore)
    model = _kept_fp8_model(fp8)
    kinds = [
        {
            name: isinstance(getattr(layer, name) if name in ("qkv", "o") else getattr(layer.mlp, name), Fp8Linear)
            for name in ("qkv", "o", "gate_up", "down")
        }
        for layer in model.layers
    ]
    assert kinds == [
        {"qkv": True, "o": True, "gate_up": True, "down": False},
        {"qkv": True, "o": False, "gate_up": True, "down": True},
    ]
    assert not isinstance(model.lm_head, Fp8Linear)
    static = model.layers[0].qkv
    assert isinstance(static, Fp8Linear) and static.input_scale is not None  # the checkpoint's static scale


def test_fused_parts_that_mix_fp8_and_unquantized_weights_are_refused(dense_dir, tmp_path):
    from traceless.errors import ModelLoadError

    fp8, _ = write_fp8_checkpoint(dense_dir, tmp_path, "fp8-dynamic", ignore=("model.layers.0.self_attn.k_proj",))
    with pytest.raises(ModelLoadError, match="mix FP8"):
        _kept_fp8_model(fp8)


def test_emulated_fp8_matmuls_agree_with_the_dequantized_model(peaked_dir, tmp_path, monkeypatch):
    """The GPU path's arithmetic (FP8 weights, per-token FP8 activations) emulated on the CPU:
    next-token agreement with the dequantized model over greedy runs, where the reference's best
    token leads by more than 1 nat: with logits of ~+-20, FP8 activations (3 mantissa bits) move
    a log-probability by up to ~0.8 nats here, and nearer choices may swap."""
    from tests.support.fp8_agreement import top1_agreement
    from traceless.runner import build

    fp8, _ = write_fp8_checkpoint(peaked_dir, tmp_path, "fp8-block")
    reference = LLM(str(fp8), dtype="float32", kv_cache_memory=4 * 2**20)
    monkeypatch.setattr(build, "_keep_fp8", lambda cfg, device: True)
    emulated = LLM(str(fp8), dtype="float32", kv_cache_memory=4 * 2**20)
    assert isinstance(emulated.engine._executor.model.layers[0].qkv, Fp8Linear)
    got = top1_agreement(emulated, reference, _prompts("agree", (5, 9, 13)), 40, margin=1.0)
    assert got.decisive >= 60 and got.top1 >= 0.99 and got.max_gap < 1.0, got


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (FP8 matmuls: Hopper or later)")
def test_fp8_matmuls_on_the_gpu_agree_with_the_dequantized_model(peaked_dir, tmp_path):
    """torch._scaled_mm with row-wise scales against the same checkpoint dequantized to bfloat16:
    top-1 agreement >= 99% over a 256-token greedy run (at the positions where the reference's
    best token leads by more than 1 nat, as in the CPU test above); the reference tokens'
    log-probabilities within 1 nat."""
    from tests.support.fp8_agreement import top1_agreement

    fp8, _ = write_fp8_checkpoint(peaked_dir, tmp_path, "fp8-dynamic")
    common = dict(dtype="bfloat16", device="cuda", kv_cache_memory=64 * 2**20, max_model_len=256 + 16)
    on_gpu = LLM(str(fp8), **common)
    assert isinstance(on_gpu.engine._executor.model.layers[0].qkv, Fp8Linear)
    dequantized = LLM(str(fp8), quantization="none", **common)
    got = top1_agreement(on_gpu, dequantized, _prompts("gpu", (8,)), 256, margin=1.0)
    assert got.decisive >= 128 and got.top1 >= 0.99 and got.max_gap < 1.0, got
