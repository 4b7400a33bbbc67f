"""Sampling parameters that several engine tests run together."""

from __future__ import annotations

from traceless import SamplingParams


def mixed_params() -> list[SamplingParams]:
    """Greedy, top-p with a seed, top-k with a stop string, min-p with penalties and logprobs."""
    return [
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=25, seed=3, ignore_eos=True),
        SamplingParams(temperature=1.0, top_k=5, max_tokens=20, stop=["w100 w"], ignore_eos=True),
        SamplingParams(
            temperature=0.5,
            min_p=0.1,
            max_tokens=40,
            repetition_penalty=1.3,
            presence_penalty=0.5,
            logprobs=3,
            ignore_eos=True,
        ),
    ]
