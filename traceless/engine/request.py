"""Per-request state: the one object that owns a request's tokens while it lives.

No torch here. Token ids are user content, so the object exposes counts and narrow read methods,
its repr shows only ids and counts, and `wipe()` (called by the engine's single release path,
whatever way the request ends) overwrites and drops every token it held.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import TYPE_CHECKING

from traceless.engine.step_io import TokenLogprobs
from traceless.sampling_params import SamplingParams

if TYPE_CHECKING:
    from traceless.structured.grammar import Guide


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.finished else None


_FINISHED = frozenset(
    {
        RequestStatus.FINISHED_STOPPED,
        RequestStatus.FINISHED_LENGTH,
        RequestStatus.FINISHED_ABORTED,
        RequestStatus.FINISHED_ERROR,
    }
)
_TRANSITIONS: dict[RequestStatus, frozenset[RequestStatus]] = {
    RequestStatus.WAITING: frozenset({RequestStatus.RUNNING}) | _FINISHED,
    RequestStatus.RUNNING: frozenset({RequestStatus.PREEMPTED}) | _FINISHED,
    RequestStatus.PREEMPTED: frozenset({RequestStatus.RUNNING}) | _FINISHED,
    **{s: frozenset() for s in _FINISHED},
}


class InvalidTransition(RuntimeError):
    pass


class Request:
    """A request's tokens and progress.

    num_computed_tokens counts tokens whose KV is in the cache; the scheduler's one rule is to let
    it catch up with num_tokens (prompt + generated). That covers prefill, chunked prefill and
    decode alike: a decode step computes the one token sampled last. With speculative decoding a
    decoding request may also carry draft tokens proposed from its own tokens (`draft_token_ids`):
    they live for one step, in which they are verified along with the last sampled token.

    A request that asks for prompt logprobs collects them here as its prefill chunks compute them
    (`num_prompt_logprobs` positions so far; a recompute after preemption does not repeat them) and
    hands them over once, complete, with its first output (`take_prompt_logprobs`).
    """

    __slots__ = (
        "request_id",
        "params",
        "eos_token_ids",
        "arrival_time",
        "first_token_time",
        "status",
        "num_computed_tokens",
        "stop_reason",
        "_prompt",
        "_output",
        "num_prompt_tokens",
        "domain",
        "_drafts",
        "_prompt_lps",
        "_prompt_lps_taken",
        "guide",
        "long_context",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: frozenset[int],
        arrival_time: float | None = None,
        domain: bytes | None = None,
        guide: Guide | None = None,
    ):
        self.request_id = request_id
        self.params = params
        self.eos_token_ids = eos_token_ids
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.first_token_time: float | None = None
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.stop_reason: str | int | None = None
        self._prompt = list(prompt_token_ids)
        self._output: list[int] = []
        self.num_prompt_tokens = len(self._prompt)
        self.domain = domain  # prefix-cache isolation domain (derived from the client's salt), or None
        self._drafts: list[int] = []  # proposed continuation, verified in the next step only
        self._prompt_lps: list[TokenLogprobs] = []  # position k scores prompt token k + 1
        self._prompt_lps_taken = False
        self.guide = guide  # structured output: the grammar matcher, advanced with every output token
        self.long_context = False  # LongRoPE: its KV comes from the long factors (scheduler, model/rope.py)

    # --- read-only views -------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self._prompt) + len(self._output)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output (a copy)."""
        n_prompt = len(self._prompt)
        if end <= n_prompt:
            return self._prompt[start:end]
        if start >= n_prompt:
            return self._output[start - n_prompt : end - n_prompt]
        return self._prompt[start:] + self._output[: end - n_prompt]

    def prompt_token_ids(self) -> list[int]:
        return list(self._prompt)

    def output_token_ids(self) -> list[int]:
        return list(self._output)

    @property
    def draft_token_ids(self) -> tuple[int, ...]:
        return tuple(self._drafts)

    @property
    def num_draft_tokens(self) -> int:
        return len(self._drafts)

    @property
    def num_prompt_logprobs(self) -> int:
        """Prompt positions whose logprobs are computed (all P - 1 once handed over)."""
        return self.num_prompt_tokens - 1 if self._prompt_lps_taken else len(self._prompt_lps)

    @property
    def last_token_id(self) -> int:
        return self._output[-1] if self._output else self._prompt[-1]

    # --- transitions -----------------------------------------------------------------------
    def transition(self, new: RequestStatus) -> None:
        if new not in _TRANSITIONS[self.status]:
            raise InvalidTransition(f"request {self.request_id}: {self.status.value} -> {new.value}")
        self.status = new

    def append_output(self, token_id: int) -> None:
        if self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self._output.append(token_id)

    def add_prompt_logprobs(self, lps: list[TokenLogprobs]) -> None:
        self._prompt_lps.extend(lps)
        if len(self._prompt_lps) > self.num_prompt_tokens - 1:
            raise RuntimeError(f"request {self.request_id}: more prompt logprobs than prompt positions")

    def take_prompt_logprobs(self) -> list[TokenLogprobs] | None:
        """The prompt's logprobs, once, when the request asked for them and all are computed."""
        if (
            self.params.prompt_logprobs is None
            or self._prompt_lps_taken
            or len(self._prompt_lps) != self.num_prompt_tokens - 1
        ):
            return None
        self._prompt_lps_taken = True
        out, self._prompt_lps = self._prompt_lps, []
        return out

    def set_drafts(self, token_ids: list[int]) -> None:
        """Replace the draft tokens (the old ones are overwritten first)."""
        self.clear_drafts()
        self._drafts.extend(token_ids)

    def clear_drafts(self) -> None:
        _overwrite(self._drafts)

    def wipe(self) -> None:
        """Overwrite and drop every token id this request held (the release path calls this)."""
        for buf in (self._prompt, self._output, self._drafts):
            _overwrite(buf)
        for lp in self._prompt_lps:
            lp.wipe()
        self._prompt_lps.clear()
        self.stop_reason = None
        self.domain = None
        if self.guide is not None:
            self.guide.release()
            self.guide = None

    def __repr__(self) -> str:  # never the tokens themselves
        return (
            f"Request(id={self.request_id!r}, status={self.status.value}, prompt_tokens={self.num_prompt_tokens}, "
            f"output_tokens={len(self._output)}, computed={self.num_computed_tokens})"
        )

    __str__ = __repr__


def _overwrite(buf: list[int]) -> None:
    for i in range(len(buf)):
        buf[i] = 0
    buf.clear()
