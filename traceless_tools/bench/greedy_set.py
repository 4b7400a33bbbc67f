"""Greedy agreement with a peer engine on the same file: traceless's side, written as token ids.

Prompt set: the quantized-model agreement test's (ten chat prompts through the model's chat
template, two plain-text openings), tokenized by traceless. For each prompt:

    continuation_float32  the float32 (dequantized) model's 32 greedy tokens; prompt + these is the
                          teacher-forced sequence every engine scores
    top1_float32, top1    each model's top-1 next token at every position 1.. of that sequence (one
                          prefill with prompt_logprobs), float32 and the default (the file's own
                          quantized blocks)
    continuation          the default model's own 32 greedy tokens (free-running)

The peer script (bench/peer/llamacpp_offline.py --greedy-set) scores the same sequences and
continues the same prompts, and counts agreeing positions. Only the fixed benchmark prompts pass
through here; the file holds their token ids and nothing else.

    python -m traceless_tools.bench.greedy_set --json FILE [--model GGUF]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CHAT = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a child.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into Spanish and German.",
    "What is 17 times 23?",
    "Give me a recipe for pancakes.",
    "Who wrote Pride and Prejudice?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Write a Python function that reverses a string.",
)
PLAIN = ("The history of the printing press", "def fibonacci(n):")
NEW_TOKENS = 32


def _top1(llm, seqs: list[list[int]]) -> list[list[int]]:
    """Top-1 next token at every position 1.. of each sequence (teacher-forced)."""
    from traceless.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, prompt_logprobs=1)
    outs = llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
    return [[next(t for t, lp in entry.items() if lp.rank == 1) for entry in o.prompt_logprobs[1:]] for o in outs]


def _greedy(llm, prompts: list[list[int]]) -> list[list[int]]:
    from traceless.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def build(model: str | None) -> dict:
    from traceless.entrypoints.llm import LLM

    ref = LLM(model, dtype="float32", kv_cache_memory=256 * 2**20, max_model_len=2048)
    tok = ref.get_tokenizer()
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False) for p in CHAT
    ] + [tok.encode(p) for p in PLAIN]
    cont32 = _greedy(ref, prompts)
    seqs = [p + c for p, c in zip(prompts, cont32)]
    top1_float32 = _top1(ref, seqs)
    del ref
    quant = LLM(model, kv_cache_memory=256 * 2**20, max_model_len=2048)
    return {
        "model": quant.engine.model_name,
        "quantization": quant.engine.model.quantization,
        "new_tokens": NEW_TOKENS,
        "prompts": prompts,
        "continuation_float32": cont32,
        "top1_float32": top1_float32,
        "top1": _top1(quant, seqs),
        "continuation": _greedy(quant, prompts),
    }


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of positions where two lists of token lists agree (position by position)."""
    pairs = [(x, y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="traceless's greedy tokens on the agreement prompt set (JSON)")
    p.add_argument("--model", help="GGUF file (default: the built-in model)")
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    out = build(args.model)
    out["agreement_top1_float32"] = agreement(out["top1"], out["top1_float32"])
    out["agreement_free_float32"] = agreement(out["continuation"], out["continuation_float32"])
    args.json.write_text(json.dumps(out) + "\n")
    print(
        f"default vs float32: teacher-forced top-1 {out['agreement_top1_float32']:.4f}, "
        f"free-running {out['agreement_free_float32']:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
