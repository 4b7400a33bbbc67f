"""Decode steps for no one while a shaped stream is open: the engine's work does not end with an answer.

A shaped stream's chunks leave on a timer (node/framing/paced.py), but the timer shares the process
and the CPU with the engine: while the engine decodes, the timer's wake-ups come later and more
unevenly (the engine thread holds the interpreter, or a core), so the spread of a stream's tick gaps
showed when its engine stopped working, and so the answer's natural length, whatever padding
followed it. The ballast removes the difference at its source: while a shaped stream holds the
engine (AsyncEngine.defer_idle) and no request runs, the engine runs one request of its own, a
sampled decode (temperature 1, the API's default, so its sampling costs what a request's does) from
one fixed token that ignores EOS, whose outputs go nowhere; a real request that
arrives aborts it (so real requests run exactly as before, one batch row each); when the streams end
it is aborted within the hold. Its cost is that decode, on an engine that would otherwise be idle:
CPU (or GPU) time, not throughput.

Its outputs go to the event loop like a request's and are formatted there as a streamed
completion's events, then dropped (server/ballast_sink.py): the loop's work per token, not only
the engine's, does not end with an answer.

It holds no user content: its prompt is a constant, its KV blocks are released and zeroed like any
request's.
"""

from __future__ import annotations

from traceless.engine.llm_engine import LLMEngine, StepOutput
from traceless.sampling_params import SamplingParams

BALLAST_ID = "ballast"  # the server names its requests cmpl-/chatcmpl-<hex>-<n>: never this
BALLAST_PROMPT = (0,)
MAX_BALLAST_TOKENS = 256  # then it restarts (a fresh prefill of one token), if still held


class Ballast:
    """Started and stopped by the engine thread before each turn (AsyncEngine._turn)."""

    def __init__(self, enabled: bool = False):
        self.enabled = enabled
        self.steps = 0  # decode steps it has had since start (tests read it; never published)

    def update(self, engine: LLMEngine, held: bool) -> None:
        """Run the ballast while `held` (a shaped stream is open) and no other request is in the engine."""
        ids = engine.request_ids()
        mine = BALLAST_ID in ids
        others = len(ids) > int(mine)
        if mine and (others or not held or not self.enabled):
            engine.abort(BALLAST_ID)
        elif not mine and held and not others and self.enabled:
            limit = max(1, min(MAX_BALLAST_TOKENS, engine.max_model_len - len(BALLAST_PROMPT) - 1))
            engine.add_request(
                BALLAST_ID,
                list(BALLAST_PROMPT),
                SamplingParams(max_tokens=limit, temperature=1.0, seed=0, ignore_eos=True),
                reported=False,
            )

    @staticmethod
    def running(engine: LLMEngine) -> int:
        """1 while the ballast is in the engine (it is only there when nothing else is), else 0."""
        return int(BALLAST_ID in engine.request_ids())

    def count(self, outputs: list[StepOutput]) -> None:
        """Count the ballast's outputs of a step (they go on to the loop, server/ballast_sink.py)."""
        self.steps += sum(1 for o in outputs if o.request_id == BALLAST_ID)
