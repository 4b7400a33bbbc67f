"""What generation returns, shaped like vLLM's RequestOutput/CompletionOutput.

These objects carry the user's own content back to the user; the engine keeps no reference to
them after the request ends.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Logprob:
    logprob: float
    rank: int  # 1 = most likely token at this position
    decoded_token: str | None = None


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that matched
    logprobs: tuple[dict[int, Logprob], ...] | None = None
    cumulative_logprob: float | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    outputs: tuple[CompletionOutput, ...]
    finished: bool
    # With SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (as vLLM).
    prompt_logprobs: tuple[dict[int, Logprob] | None, ...] | None = None
