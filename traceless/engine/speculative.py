"""Speculative decoding, the engine side (no torch): where drafts come from, and counters.

Drafts come only from the request itself or from the model (threat T7, docs/threat-model.md: never from a database
shared across users, which would hold other users' tokens):

    ngram   prompt lookup: the request's last n tokens (n from ngram_max down to ngram_min) are
            looked up in its own earlier tokens (prompt + output); the k tokens that followed the
            most recent earlier occurrence are the drafts. Proposed here, before scheduling.
    draft   self-speculation: the model's first layers propose k drafts inside the step
            (runner/draft.py); the scheduler reserves the k positions.

A decoding request with d drafts is scheduled for 1 + d tokens; the runner verifies them
(runner/rejection.py) so that the output has exactly the distribution of plain decoding.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from traceless.engine.request import Request
from traceless.modes import SpecMode

_ITEM = 4  # bytes per token id in the lookup buffer (array 'i': int32)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    mode: SpecMode = SpecMode.OFF
    num_tokens: int = 4  # k: drafts per decoding step at most
    ngram_min: int = 2
    ngram_max: int = 4

    def __post_init__(self) -> None:
        if self.num_tokens < 1 or not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("num_tokens >= 1 and 1 <= ngram_min <= ngram_max are required")

    @property
    def model_drafts(self) -> int:
        """Draft positions the scheduler reserves for drafts the model makes inside the step."""
        return self.num_tokens if self.mode is SpecMode.DRAFT else 0


@dataclass(slots=True)
class SpecStats:
    """Numbers only: drafts sent to verification, drafts accepted, and (request, step) pairs that
    verified at least one draft. Emitted tokens = accepted + one per verifying pair."""

    proposed: int = 0
    accepted: int = 0
    verify_steps: int = 0

    def record(self, num_drafts: int, num_accepted: int) -> None:
        if num_drafts:
            self.proposed += num_drafts
            self.accepted += num_accepted
            self.verify_steps += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "proposed": self.proposed,
            "accepted": self.accepted,
            "verify_steps": self.verify_steps,
            "acceptance_rate": self.acceptance_rate,
        }


class NgramProposer:
    """Prompt lookup over each request's own tokens; holds no state between calls."""

    def __init__(self, config: SpeculativeConfig):
        self.config = config

    def propose(self, request: Request) -> list[int]:
        c = self.config
        tokens = request.token_ids(0, request.num_tokens)
        try:
            return find_ngram(tokens, c.ngram_min, c.ngram_max, c.num_tokens)
        finally:
            tokens[:] = [0] * len(tokens)  # the copy holds user content: overwrite before it is dropped


def find_ngram(tokens: list[int], n_min: int, n_max: int, k: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the last n tokens,
    trying n = n_max down to n_min; [] when no suffix occurs earlier.

        tokens   a b c x y z ... a b c | ?      suffix "a b c" (n = 3) matched at i = 0
        drafts         x y z ...               tokens[i + n : i + n + k]

    The search runs in C (bytes.rfind over int32 ids); a match must be aligned to a token and
    must end before the last token, so at least one draft follows it.
    """
    L = len(tokens)
    if L < 2 or k < 1:
        return []
    buf = bytearray(array("i", tokens))
    try:
        for n in range(min(n_max, L - 1), n_min - 1, -1):
            i = _rfind_aligned(buf, bytes(buf[(L - n) * _ITEM :]), (L - 1) * _ITEM)
            if i is not None:
                return tokens[i + n : i + n + k]
        return []
    finally:
        buf[:] = bytes(len(buf))


def _rfind_aligned(buf: bytearray, needle: bytes, end: int) -> int | None:
    """Token index of the last token-aligned occurrence of needle inside buf[:end], or None."""
    while True:
        pos = buf.rfind(needle, 0, end)
        if pos < 0:
            return None
        if pos % _ITEM == 0:
            return pos // _ITEM
        end = pos + len(needle) - 1  # a match straddling token boundaries: look further left
