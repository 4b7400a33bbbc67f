"""Offline API shaped like vLLM's: `LLM(...).generate(prompts, params)` and `.chat(messages, params)`."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

from traceless.config import EngineConfig
from traceless.engine.llm_engine import LLMEngine, StepOutput
from traceless.entrypoints.build import build_engine
from traceless.errors import InvalidRequestError
from traceless.modes import DType, as_mode
from traceless.outputs import CompletionOutput, Logprob, RequestOutput
from traceless.sampling_params import SamplingParams

PromptType = str | dict


@dataclass(slots=True)
class _Accumulated:
    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_logprobs: list | None = None  # TokenLogprobs per prompt position after the first


class LLM:
    """An engine on one model. `LLM()` loads the built-in default model (SmolLM2-135M-Instruct)."""

    def __init__(self, model: str | None = None, dtype: DType | str = DType.AUTO, **engine_options):
        """engine_options: EngineConfig's other fields; a mode takes its Enum or its word ("global")."""
        self.engine = build_engine(EngineConfig(model=model, dtype=as_mode("dtype", DType, dtype), **engine_options))
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """An LLM around an engine built elsewhere (tests, tools that assemble EngineParts themselves)."""
        llm = cls.__new__(cls)
        llm.engine = engine
        llm._ids = itertools.count()
        return llm

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. A prompt is a string or {"prompt_token_ids": [...]}."""
        items = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        return self._run([self._prompt(p) for p in items], self._params(sampling_params, len(items)), use_tqdm)

    def chat(
        self,
        messages: list[dict] | Sequence[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Applies the model's chat template to each conversation, then generates."""
        # One conversation (a list of message dicts) or several; the first element tells which.
        conversations: list[list[dict]]
        if messages and isinstance(messages[0], dict):
            conversations = [cast("list[dict]", messages)]
        else:
            conversations = list(cast("Sequence[list[dict]]", messages))
        tok = self.engine.tokenizer
        prompts: list[tuple[str | None, str | list[int], str | None]] = []
        for conv in conversations:
            text = tok.apply_chat_template(list(conv), add_generation_prompt=add_generation_prompt)
            prompts.append((text, tok.encode(text, add_special_tokens=False), None))
        return self._run(prompts, self._params(sampling_params, len(prompts)), use_tqdm)

    def stream_chat(self, messages: list[dict], sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """One conversation's answer, piece by piece: one piece per engine step (empty while the
        prompt is prefilled), for a terminal that shows the answer as it comes. Closing the iterator
        before the answer ends aborts the request: its KV blocks are freed and zeroed. The engine
        must not be stepped by anyone else meanwhile (other requests' outputs are dropped)."""
        params = sampling_params or SamplingParams()
        if params.n != 1:
            raise InvalidRequestError("stream_chat streams one answer: n must be 1")
        tok = self.engine.tokenizer
        text = tok.apply_chat_template(list(messages), add_generation_prompt=True)
        rid = f"gen-{next(self._ids)}"
        self.engine.add_request(rid, tok.encode(text, add_special_tokens=False), params)
        finished = False
        try:
            while not finished:
                pieces = []
                for out in self.engine.step():
                    if out.request_id == rid:
                        pieces.append(out.new_text)
                        finished = out.finished
                yield "".join(pieces)
        finally:
            if not finished:
                self.engine.abort(rid)

    # -------------------------------------------------------------------------------------------
    def _prompt(self, p: PromptType) -> tuple[str | None, str | list[int], str | None]:
        """(prompt text, what the engine takes, cache_salt)."""
        if isinstance(p, str):
            return p, p, None
        if isinstance(p, dict):
            salt = p.get("cache_salt")
            keys = set(p) - {"cache_salt"}
            if keys == {"prompt_token_ids"}:
                return None, p["prompt_token_ids"], salt
            if keys == {"prompt"}:
                return p["prompt"], p["prompt"], salt
        raise InvalidRequestError(
            'a prompt is a string, or a dict with "prompt" (str) or "prompt_token_ids" '
            '([int, ...]) and optionally "cache_salt"'
        )

    @staticmethod
    def _params(params, count: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * count
        if isinstance(params, SamplingParams):
            return [params] * count
        params = list(params)
        if len(params) != count:
            raise InvalidRequestError(f"got {len(params)} sampling params for {count} prompts")
        return params

    def _run(
        self,
        prompts: list[tuple[str | None, str | list[int], str | None]],
        params: list[SamplingParams],
        use_tqdm: bool,
    ) -> list[RequestOutput]:
        from tqdm.auto import tqdm

        children: dict[str, tuple[int, int]] = {}  # child request id -> (prompt index, completion index)
        prompt_ids: list[tuple[int, ...]] = []
        try:
            self._add_requests(prompts, params, children, prompt_ids)
            acc = {rid: _Accumulated() for rid in children}
            with tqdm(total=len(prompts), desc="Generating", unit="prompt", disable=not use_tqdm) as bar:
                self._step_until_done(params, children, acc, bar.update)
        except BaseException:
            for rid in children:
                self.engine.abort(rid)
            raise
        return self._collect(prompts, params, prompt_ids, children, acc)

    def _add_requests(
        self,
        prompts: list[tuple[str | None, str | list[int], str | None]],
        params: list[SamplingParams],
        children: dict[str, tuple[int, int]],
        prompt_ids: list[tuple[int, ...]],
    ) -> None:
        """Each prompt's n completions as engine requests. `children` grows as they are added, so
        that a failure part-way aborts those already in the engine."""
        for i, ((_, prompt, salt), p) in enumerate(zip(prompts, params)):
            for j in range(p.n):
                rid = f"gen-{next(self._ids)}"
                ids = self.engine.add_request(rid, prompt, p.with_seed_offset(j) if p.n > 1 else p, cache_salt=salt)
                children[rid] = (i, j)
                if j == 0:
                    prompt_ids.append(tuple(ids))

    def _step_until_done(
        self,
        params: list[SamplingParams],
        children: dict[str, tuple[int, int]],
        acc: dict[str, _Accumulated],
        prompt_done: Callable[[int], object],
    ) -> None:
        """Engine steps until every completion has finished; prompt_done(1) once per prompt whose
        completions have all finished (the progress bar)."""
        remaining = [p.n for p in params]
        while any(remaining):
            for out in self.engine.step():
                if out.request_id not in acc:
                    continue
                self._accumulate(acc[out.request_id], out)
                if out.finished:
                    i = children[out.request_id][0]
                    remaining[i] -= 1
                    if remaining[i] == 0:
                        prompt_done(1)

    def _accumulate(self, a: _Accumulated, out: StepOutput) -> None:
        a.token_ids.extend(out.new_token_ids)
        a.text.append(out.new_text)
        if out.new_logprobs is not None:
            a.logprobs = (a.logprobs or []) + [
                self._logprob_dict(lp, t) for lp, t in zip(out.new_logprobs, out.new_token_ids)
            ]
        if out.prompt_logprobs is not None:
            a.prompt_logprobs = out.prompt_logprobs
        if out.finished:
            a.finish_reason, a.stop_reason = out.finish_reason, out.stop_reason

    def _logprob_dict(self, lp, token_id: int) -> dict[int, Logprob]:
        """Top-N of the position plus the sampled token (as vLLM returns them)."""
        tok = self.engine.tokenizer
        d = {
            tid: Logprob(v, rank + 1, tok.decode([tid], skip_special_tokens=False))
            for rank, (tid, v) in enumerate(zip(lp.top_ids, lp.top_logprobs))
        }
        if token_id not in d:
            d[token_id] = Logprob(lp.token_logprob, lp.token_rank, tok.decode([token_id], skip_special_tokens=False))
        return d

    def _collect(self, prompts, params, prompt_ids, children, acc) -> list[RequestOutput]:
        per_prompt: list[list[CompletionOutput]] = [[] for _ in prompts]
        prompt_lps: list[tuple[dict[int, Logprob] | None, ...] | None] = [None] * len(prompts)
        for rid, (i, j) in children.items():
            a = acc[rid]
            if j == 0 and a.prompt_logprobs is not None:
                prompt_lps[i] = (
                    None,
                    *(self._logprob_dict(lp, t) for lp, t in zip(a.prompt_logprobs, prompt_ids[i][1:])),
                )
            cum = sum(d[t].logprob for d, t in zip(a.logprobs, a.token_ids) if t in d) if a.logprobs else None
            per_prompt[i].append(
                CompletionOutput(
                    j,
                    "".join(a.text),
                    tuple(a.token_ids),
                    a.finish_reason,
                    a.stop_reason,
                    tuple(a.logprobs) if a.logprobs is not None else None,
                    cum,
                )
            )
        return [
            RequestOutput(
                f"{i}", prompts[i][0], prompt_ids[i], tuple(sorted(outs, key=lambda c: c.index)), True, prompt_lps[i]
            )
            for i, outs in enumerate(per_prompt)
        ]
