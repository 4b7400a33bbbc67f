"""A request on quantized weights computes the same numbers alone as inside a batch of strangers.

The same greedy request runs alone (a prefill of 7 rows, then one row a step) and beside 40 other
requests (a prefill step of several hundred rows, then decode steps of 41 rows): its tokens, its
log-probabilities and every logits row it produced must be equal to the bit. One machine, one code
path: a matmul whose numerics changed with the number of rows in the call (an int8 path for small
calls, a dequantized float path for large ones) would move them, and a request's output would then
carry information about the other users sharing its batch."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.conftest import make_tiny_model
from tests.model.gguf_helpers import GGUFSpec, Hyper, byte_level_vocab, hf_state, write_gguf
from traceless import LLM, SamplingParams
from traceless.config import EngineConfig
from traceless.engine.llm_engine import LLMEngine
from traceless.runner.batch import SHORT_MAX_TOKENS
from traceless.runner.build import build_engine_parts

TARGET = [17, 300, 42, 8, 99, 250, 3]
N_NEW = 6


def _strangers(n: int) -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(3, 384) for _ in range(rng.randrange(4, 20))] for _ in range(n)]


@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = make_tiny_model(tmp_path_factory.mktemp("hf-batch"), "llama", seed=3, intermediate_size=256)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return hf_state(model), Hyper.from_hf(json.loads((path / "config.json").read_text()), "llama")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class LogitsTap:
    """Copies of every logits matrix the model computes, one per step ([R, V] float32)."""

    def __init__(self, model):
        self.steps: list[torch.Tensor] = []
        inner = model.logits

        def tapped(hidden: torch.Tensor) -> torch.Tensor:
            out = inner(hidden)
            self.steps.append(out.clone())
            return out

        model.logits = tapped


def _run(path: Path, prompts: list[list[int]], budget: int | None = None, prompt_logprobs: int | None = None):
    config = EngineConfig(model=str(path), kv_cache_memory=16 * 2**20)
    if budget is not None:
        config = replace(config, max_num_batched_tokens=budget)
    parts = build_engine_parts(config)
    assert parts.model.quantization == "gguf"
    tap = LogitsTap(parts.executor.model)  # type: ignore[attr-defined]
    llm = LLM.from_engine(LLMEngine(config, parts))
    params = SamplingParams(
        temperature=0.0, max_tokens=N_NEW, ignore_eos=True, logprobs=20, prompt_logprobs=prompt_logprobs
    )
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.engine.check_integrity()
    return outs, tap.steps


@pytest.mark.parametrize("qname", ["Q4_0", "Q8_0"])
def test_a_request_alone_and_among_strangers_computes_the_same_bits(hf_tiny, tmp_path, qname):
    from gguf import GGMLQuantizationType

    state, hyper = hf_tiny
    path = tmp_path / f"tiny-{qname}.gguf"
    write_gguf(path, GGUFSpec(hyper, state, GGMLQuantizationType[qname], byte_level_vocab(hyper.vocab_size)))
    alone, alone_steps = _run(path, [TARGET])
    crowd, crowd_steps = _run(path, _strangers(20) + [TARGET] + _strangers(40)[20:])
    mine = crowd[20].outputs[0]
    assert list(mine.token_ids) == list(alone[0].outputs[0].token_ids)
    for want, got in zip(alone[0].outputs[0].logprobs, mine.logprobs):
        assert {t: lp.logprob for t, lp in want.items()} == {t: lp.logprob for t, lp in got.items()}
    # every step: the request's logits row is among the crowded step's rows, to the bit
    assert len(alone_steps) == len(crowd_steps) == N_NEW
    assert crowd_steps[0].shape[0] == 41
    for row, step in zip(alone_steps, crowd_steps):
        assert row.shape[0] == 1
        assert any(torch.equal(row[0].view(torch.int32), r.view(torch.int32)) for r in step)


def test_a_prompt_gives_the_same_bits_in_one_piece_or_cut_into_chunks(hf_tiny, tmp_path):
    """The scheduler cuts a prompt where the step's token budget ends, which depends on the other
    requests. Up to SHORT_MAX_TOKENS new tokens a step, a prompt's attention runs on the native
    rows, each query row on its own from the cache: however it was cut, its numbers are the same."""
    from gguf import GGMLQuantizationType

    state, hyper = hf_tiny
    path = tmp_path / "tiny-Q8_0.gguf"
    write_gguf(path, GGUFSpec(hyper, state, GGMLQuantizationType.Q8_0, byte_level_vocab(hyper.vocab_size)))
    rng = random.Random(9)
    mine = [rng.randrange(3, 384) for _ in range(100)]  # a W2 prompt's size, in one native step
    assert len(mine) <= SHORT_MAX_TOKENS
    whole, _ = _run(path, [mine], prompt_logprobs=5)
    # a 24-token budget: chunks of varying size, beside the strangers' prefills and decodes
    cut, _ = _run(path, _strangers(3) + [mine], budget=24, prompt_logprobs=5)

    def numbers(out) -> list[dict[int, float]]:
        steps = list(out.prompt_logprobs[1:]) + list(out.outputs[0].logprobs)
        return [{t: lp.logprob for t, lp in step.items()} for step in steps]

    assert numbers(cut[-1]) == numbers(whole[0])
