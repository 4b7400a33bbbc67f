"""Asynchronous scheduling (EngineConfig.async_scheduling): the host schedules and launches step
n + 1 while the device runs step n, and reads step n's tokens after that.

    step():  [read n if running ahead is unsafe] -> schedule n+1 -> launch n+1 -> read n
             -> stop checks, outputs and releases of n (a step late) -> [StepOutputs of n]

A request whose step n samples is scheduled for step n + 1 with that token as a placeholder (the
runner takes it from the device, runner/run_ahead.py). When step n's token stops the request, the
token step n + 1 computed for it is dropped: the output is cut at the stop exactly as when
stepping synchronously, and greedy output is the same token for token. The engine runs a step
synchronously (reading the plan in flight first) whenever running ahead could change what a
request computes: a request that needs its tokens on the host (grammar, logprobs, prompt
logprobs, penalties, logit bias), speculative decoding, or a step that could preempt.
"""

from __future__ import annotations

from collections.abc import Callable

from traceless.engine.request import Request
from traceless.engine.step_io import PendingResult, SampledTokens, SchedulerOutput


def is_plain(request: Request) -> bool:
    """A request whose next steps need nothing of its last token on the host."""
    p = request.params
    return (
        request.guide is None
        and p.logprobs is None
        and p.prompt_logprobs is None
        and not p.needs_penalties
        and not p.logit_bias
    )


class InFlight:
    """The one plan launched and not read yet."""

    def __init__(self) -> None:
        self._plan: SchedulerOutput | None = None
        self._result: PendingResult | None = None

    def __bool__(self) -> bool:
        return self._plan is not None

    def hold(self, plan: SchedulerOutput, result: PendingResult) -> None:
        if self._plan is not None:
            raise RuntimeError("a plan is already in flight")
        self._plan, self._result = plan, result

    def take(self) -> tuple[SchedulerOutput, Callable[[], dict[str, SampledTokens]]] | None:
        """The plan in flight and the call that waits for its tokens; nothing is in flight after."""
        if self._plan is None or self._result is None:
            return None
        plan, result = self._plan, self._result
        self._plan = self._result = None
        return plan, result.result
