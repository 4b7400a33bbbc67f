"""Sampling parameters, shaped like vLLM's so its users already know them.

Every field is validated on construction; an invalid or unsupported value raises
`InvalidRequestError` (a `ValueError`) naming the field. Nothing is accepted and then ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from traceless.errors import InvalidRequestError
from traceless.structured.spec import StructuredOutput

MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_N = 16
MAX_LOGIT_BIAS = 1024  # entries of logit_bias
LOGIT_BIAS_RANGE = 100.0


class OutputKind(Enum):
    """What the engine reports per step for a request."""

    FINAL_ONLY = "final_only"  # one output when the request finishes (offline API)
    DELTA = "delta"  # new tokens and text after every step (streaming)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(f"{name} must be a number")
    if not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be finite")
    return float(value)


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an integer")
    return value


def _in_range(name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise InvalidRequestError(f"{name} must be between {lo:g} and {hi:g}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one request's output.

    temperature 0 means greedy. top_k 0 (or -1) disables top-k. `seed` makes sampling
    reproducible per request, whatever else shares the batch. `stop` strings end the output
    before the match (the stop string is not included). `logprobs` asks for the top-N
    log-probabilities of the model's distribution at each generated position (plus the sampled
    token's). `prompt_logprobs` asks for the log-probability of every prompt token after the
    first (and the top-N at each prompt position) under the raw model. `logit_bias` maps token ids
    to a bias in [-100, 100] added to the logits before sampling (and before logprobs, as vLLM
    does). presence/frequency penalties follow OpenAI (over generated tokens);
    repetition_penalty follows Hugging Face (over prompt and generated tokens).
    With n > 1 the request yields n independent completions; with a seed, completion i uses
    seed + i. `structured` constrains the output to a JSON schema, regex, choice or grammar
    (traceless/structured/); the output then ends when the grammar is complete.
    """

    n: int = 1
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); a dict is accepted and normalized
    skip_special_tokens: bool = True
    output_kind: OutputKind = field(default=OutputKind.FINAL_ONLY)
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        # Checked in this order (the first invalid field is the one named); numbers are normalized
        # in place (the dataclass is frozen, hence object.__setattr__).
        self._check_sampling()
        self._check_stops_and_penalties()
        self._check_outputs()

    def _check_sampling(self) -> None:
        set_ = object.__setattr__
        _in_range("n", _integer("n", self.n), 1, MAX_N)
        if self.max_tokens is not None and _integer("max_tokens", self.max_tokens) < 1:
            raise InvalidRequestError("max_tokens must be at least 1")
        set_(self, "temperature", _number("temperature", self.temperature))
        _in_range("temperature", self.temperature, 0.0, 100.0)
        set_(self, "top_p", _number("top_p", self.top_p))
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p must be in (0, 1]")
        top_k = _integer("top_k", self.top_k)
        if top_k < -1:
            raise InvalidRequestError("top_k must be 0 or -1 (disabled) or a positive integer")
        set_(self, "top_k", max(top_k, 0))
        set_(self, "min_p", _number("min_p", self.min_p))
        _in_range("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            _in_range("seed", _integer("seed", self.seed), -(2**63), 2**63 - 1)

    def _check_stops_and_penalties(self) -> None:
        set_ = object.__setattr__
        set_(self, "stop", self._stop_strings(self.stop))
        set_(self, "stop_token_ids", self._token_ids(self.stop_token_ids))
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be a boolean")
        for name in ("presence_penalty", "frequency_penalty"):
            set_(self, name, _number(name, getattr(self, name)))
            _in_range(name, getattr(self, name), -2.0, 2.0)
        set_(self, "repetition_penalty", _number("repetition_penalty", self.repetition_penalty))
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise InvalidRequestError("repetition_penalty must be in (0, 10]")

    def _check_outputs(self) -> None:
        if self.logprobs is not None:
            _in_range("logprobs", _integer("logprobs", self.logprobs), 0, MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _in_range("prompt_logprobs", _integer("prompt_logprobs", self.prompt_logprobs), 0, MAX_LOGPROBS)
        object.__setattr__(self, "logit_bias", self._logit_bias(self.logit_bias))
        if not isinstance(self.output_kind, OutputKind):
            raise InvalidRequestError("output_kind must be an OutputKind")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise InvalidRequestError("structured must be a StructuredOutput")

    @staticmethod
    def _stop_strings(stop: object) -> tuple[str, ...]:
        if stop is None:
            return ()
        items = (stop,) if isinstance(stop, str) else stop
        if not isinstance(items, (list, tuple)):
            raise InvalidRequestError("stop must be a string or a list of strings")
        if len(items) > MAX_STOP_STRINGS:
            raise InvalidRequestError(f"stop accepts at most {MAX_STOP_STRINGS} strings")
        for s in items:
            if not isinstance(s, str) or not s:
                raise InvalidRequestError("stop strings must be non-empty strings")
            if len(s) > MAX_STOP_STRING_CHARS:
                raise InvalidRequestError(f"stop strings must be at most {MAX_STOP_STRING_CHARS} characters")
        return tuple(items)

    @staticmethod
    def _token_ids(ids: object) -> tuple[int, ...]:
        if ids is None:
            return ()
        if not isinstance(ids, (list, tuple)):
            raise InvalidRequestError("stop_token_ids must be a list of integers")
        for t in ids:
            if _integer("stop_token_ids", t) < 0:
                raise InvalidRequestError("stop_token_ids must be non-negative")
        return tuple(ids)

    @staticmethod
    def _logit_bias(bias: object) -> tuple[tuple[int, float], ...]:
        """A dict or pairs of token id -> bias, as sorted pairs (the vocabulary bound is the
        engine's check: it knows the model)."""
        if bias is None:
            return ()
        if isinstance(bias, dict):
            items: list | tuple = list(bias.items())
        elif isinstance(bias, (list, tuple)):
            items = bias
        else:
            raise InvalidRequestError("logit_bias must map token ids to numbers")
        out: dict[int, float] = {}
        for item in items:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise InvalidRequestError("logit_bias must map token ids to numbers")
            t, b = item
            if _integer("logit_bias token ids", t) < 0:
                raise InvalidRequestError("logit_bias token ids must be non-negative")
            b = _number("logit_bias values", b)
            _in_range("logit_bias values", b, -LOGIT_BIAS_RANGE, LOGIT_BIAS_RANGE)
            out[t] = b
        if len(out) > MAX_LOGIT_BIAS:
            raise InvalidRequestError(f"logit_bias accepts at most {MAX_LOGIT_BIAS} entries")
        return tuple(sorted(out.items()))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def with_seed_offset(self, i: int) -> SamplingParams:
        """The params of the i-th of n completions (n = 1 each)."""
        from dataclasses import replace

        seed = None if self.seed is None else (self.seed + i + 2**63) % 2**64 - 2**63
        return replace(self, n=1, seed=seed)
