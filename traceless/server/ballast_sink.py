"""The ballast's outputs, formatted on the event loop as a streamed completion's and dropped.

The ballast (server/ballast.py) keeps the engine decoding while a shaped stream is open, so the
engine's load does not end with an answer. The event loop does work per token too (a request's
outputs are handed over, relayed to its response, grouped, formatted as SSE events and padded);
were the ballast's outputs dropped on the engine thread, that work would end with the answer, and
with it part of the spread of the stream's tick gaps, which shows a hop the answer's natural length.
So they take the same path as a streamed completion's, through the same Formatter, as far as the
bytes a framer would take; there they are dropped.

Nothing here is user content: the ballast's prompt is a constant token and its text is the model's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

from traceless.engine.llm_engine import StepOutput
from traceless.server.ballast import MAX_BALLAST_TOKENS
from traceless.server.openai_api import Job, OpenAIService
from traceless.server.protocol import parse_completion
from traceless.server.responses import ChoiceState, Formatter


class _Unobserved:
    """The ballast is no request: no telemetry."""

    def token(self, c: int) -> None:
        pass

    def done(self, states: list[ChoiceState]) -> None:
        pass


def _job(model_name: str) -> Job:
    body = {"model": model_name, "prompt": [0], "max_tokens": MAX_BALLAST_TOKENS, "stream": True}
    return Job("completions", parse_completion(body), [[0]], "cmpl-ballast", 0)


async def absorb(api: OpenAIService) -> None:
    """Run for the server's life (a task): each ballast run's outputs become one stream's events."""
    outputs = api.engine.ballast_outputs()
    try:
        while True:
            fmt = Formatter(_job(api.model_name), api.model_name, api.tokenizer, api.shape)
            held = bytearray()  # as a framer holds the events until its next tick
            ended = asyncio.Event()
            async for event in fmt.sse(None, _relayed(outputs, ended), _Unobserved()):
                held.extend(event)
                del held[:]
            if ended.is_set():
                return
    finally:
        await outputs.aclose()


async def _relayed(
    outputs: AsyncIterator[StepOutput], ended: asyncio.Event
) -> AsyncGenerator[tuple[int, StepOutput], None]:
    """One ballast run's outputs as (choice, output) pairs, through a queue and a task of their own
    as a request's (OpenAIService._merged): until it finishes or MAX_BALLAST_TOKENS outputs (an
    aborted run has no last output: the next run's continue the stream, which stays bounded)."""
    q: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        n = 0
        try:
            async for out in outputs:
                q.put_nowait(out)
                n += 1
                if out.finished or n >= MAX_BALLAST_TOKENS:
                    return
            ended.set()
        finally:
            q.put_nowait(None)

    task = asyncio.create_task(pump())
    try:
        while (item := await q.get()) is not None:
            yield 0, item
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
