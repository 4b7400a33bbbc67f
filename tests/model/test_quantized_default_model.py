"""The built-in model on its own Q4_1/Q8_0 blocks (the default) against the same file dequantized to
float32 (--dtype float32): teacher-forced greedy agreement.

Prompt set: traceless_tools/bench/greedy_set.py's ten chat prompts (the parity tests' set) through
the model's chat template, plus its two plain-text openings; each followed by the float32 model's
own 32 greedy tokens. At every position of those sequences both models score the next token in one
prefill (prompt_logprobs) and we count where their top-1 tokens agree. Required: >= 95% of
positions. Prefill chunks of 16 tokens run every matmul on the int8 kernels; whole prompts (>= 32
rows) on the dequantized-copy path."""
from __future__ import annotations

import pytest

from traceless import LLM, SamplingParams
from traceless_tools.bench.greedy_set import CHAT, PLAIN


def _top1(llm: LLM, seqs: list[list[int]]) -> list[list[int]]:
    """Top-1 next token at every position 1.. of each sequence (teacher-forced)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, prompt_logprobs=1)
    outs = llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
    return [[next(t for t, lp in entry.items() if lp.rank == 1) for entry in o.prompt_logprobs[1:]] for o in outs]


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [16, 2048])
def test_quantized_default_model_agrees_with_float32_on_95_percent_of_positions(real_llm, chunk):
    tok = real_llm.get_tokenizer()
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False)
               for p in CHAT] + [tok.encode(p) for p in PLAIN]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    cont = real_llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    seqs = [p + list(o.outputs[0].token_ids) for p, o in zip(prompts, cont)]

    quant = LLM(kv_cache_memory=256 * 2**20, max_model_len=2048, max_num_batched_tokens=chunk)
    assert quant.engine.model.quantization == "gguf"
    want, got = _top1(real_llm, seqs), _top1(quant, seqs)
    pairs = [(w, g) for ws, gs in zip(want, got) for w, g in zip(ws, gs)]
    agree = sum(w == g for w, g in pairs) / len(pairs)
    print(f"teacher-forced top-1 agreement: {agree:.4f} over {len(pairs)} positions")
    assert agree >= 0.95
    quant.engine.check_integrity()
