"""Next-token agreement of two engines over one's greedy runs: how close an FP8 model stays to
the dequantized one."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Agreement:
    top1: float  # share of decisive positions where the candidate's most likely token is the reference's
    decisive: int  # positions where the reference's best token leads its second by more than the margin
    max_gap: float  # largest difference of the two engines' log-probabilities of the reference's token


def top1_agreement(candidate, reference, prompts: list[list[int]], n: int, margin: float = 0.1) -> Agreement:
    """The reference decodes each prompt greedily for n tokens; the candidate then scores each whole
    sequence (prompt_logprobs). Positions where the reference's two best tokens lie within
    `margin` nats are near-ties that any rounding may swap: they count in max_gap only."""
    from traceless import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=2)
    score = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    agree = decisive = 0
    gap = 0.0
    for prompt in prompts:
        out = reference.generate({"prompt_token_ids": prompt}, greedy, use_tqdm=False)[0].outputs[0]
        tokens = list(out.token_ids)
        scored = candidate.generate({"prompt_token_ids": prompt + tokens}, score, use_tqdm=False)[0]
        for t, ref, got in zip(tokens, out.logprobs, scored.prompt_logprobs[len(prompt) :]):
            gap = max(gap, abs(got[t].logprob - ref[t].logprob))
            second = max((v.logprob for k, v in ref.items() if k != t), default=float("-inf"))
            if ref[t].logprob - second > margin:
                decisive += 1
                agree += got[t].rank == 1
    return Agreement(agree / max(decisive, 1), decisive, gap)
