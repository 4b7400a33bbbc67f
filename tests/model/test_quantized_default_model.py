"""The built-in model on its own Q4_1/Q8_0 blocks (the default) against the same file dequantized to
float32 (--dtype float32): teacher-forced greedy agreement.

Prompt set (traceless_tools/bench/greedy_set.py): the ten chat prompts (the parity tests' set)
through the model's chat template, plus two plain-text openings; each followed by the float32
model's own 32 greedy tokens. At every position of those sequences both models score the next token
in one prefill (prompt_logprobs) and we count where their top-1 tokens agree (>= 95% of positions)
and how far the quantized model's log-probability of the float32 model's top-1 token is from
float32's (mean <= 0.08 nats). Measured on AVX-512: 97.3% and 0.047 with int8 activations (the int8
kernels, llama.cpp's own precision: the activation of each 32-value block rounded to int8), against
98.7% and 0.018 when prefill ran on a dequantized bfloat16 copy. A layout or scale bug in a kernel
moves the log-probabilities by whole nats; rounding does not. Top-1 tokens that were near-ties in
float32 can flip: "What is the capital of France?" opens with "The" at -1.88 and "L" at -1.97 in
float32, so a greedy answer may start either way (llama.cpp, llama-cpp-python 0.3.36 on the same
file, answers "L'Étoile, la Cité, la Nation", as the int8 path does). Whole prompts run here; chunks
of any size run the same kernels (one for every row count; row independence:
tests/model/test_quantized_batch_invariance.py)."""

from __future__ import annotations

import pytest

from tests.support.prompts import CHAT_PROMPTS, PLAIN_OPENINGS
from traceless import LLM, SamplingParams

CHAT = CHAT_PROMPTS
PLAIN = PLAIN_OPENINGS


def _scores(llm: LLM, seqs: list[list[int]]) -> list[dict]:
    """{token: logprob} of the top 20 next tokens at every position 1.. of each sequence
    (teacher-forced), the top-1 under key "top"."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, prompt_logprobs=20)
    outs = llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
    return [
        {"top": next(t for t, lp in entry.items() if lp.rank == 1), **{t: lp.logprob for t, lp in entry.items()}}
        for o in outs
        for entry in o.prompt_logprobs[1:]
    ]


@pytest.mark.slow
def test_quantized_default_model_agrees_with_float32_on_95_percent_of_positions(real_llm):
    tok = real_llm.get_tokenizer()
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False) for p in CHAT
    ] + [tok.encode(p) for p in PLAIN]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    cont = real_llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    seqs = [p + list(o.outputs[0].token_ids) for p, o in zip(prompts, cont)]

    quant = LLM(kv_cache_memory=256 * 2**20, max_model_len=2048, max_num_batched_tokens=2048)
    assert quant.engine.model.quantization == "gguf"
    want, got = _scores(real_llm, seqs), _scores(quant, seqs)
    agree = sum(w["top"] == g["top"] for w, g in zip(want, got)) / len(want)
    drift = [abs(g[w["top"]] - w[w["top"]]) for w, g in zip(want, got) if w["top"] in g]
    mean_drift = sum(drift) / len(drift)
    print(f"teacher-forced top-1 agreement {agree:.4f}, mean |d logprob| {mean_drift:.4f} over {len(want)} positions")
    assert agree >= 0.95
    assert len(drift) >= 0.99 * len(want)  # the float32 choice stays among the top 20
    assert mean_drift <= 0.08
    quant.engine.check_integrity()
