"""OpenAI response bodies and SSE chunks for completions and chat completions."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from traceless.engine.llm_engine import StepOutput
from traceless.server.errors import ApiError, internal_error


@dataclass(slots=True)
class ChoiceState:
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)  # TokenLogprobs per generated token
    finish_reason: str | None = None

    def add(self, out: StepOutput) -> None:
        self.text.append(out.new_text)
        self.token_ids.extend(out.new_token_ids)
        if out.new_logprobs:
            self.logprobs.extend(out.new_logprobs)
        if out.finished:
            self.finish_reason = out.finish_reason


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class Formatter:
    def __init__(self, job, model_name: str, tokenizer):
        self.job = job
        self.chat = job.kind == "chat_completions"
        self.model = model_name
        self.tokenizer = tokenizer

    # --- logprobs -----------------------------------------------------------------------------
    def _tok(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _logprobs(self, token_ids: list[int], lps: list, text_offset: int = 0) -> dict | None:
        if self.job.request.logprobs is None:
            return None
        if self.chat:
            content = []
            for t, lp in zip(token_ids, lps):
                s = self._tok(t)
                top = [{"token": self._tok(i), "logprob": v, "bytes": list(self._tok(i).encode())}
                       for i, v in zip(lp.top_ids, lp.top_logprobs)]
                content.append({"token": s, "logprob": lp.token_logprob, "bytes": list(s.encode()), "top_logprobs": top})
            return {"content": content}
        tokens, offsets, offset = [], [], text_offset
        for t in token_ids:
            s = self._tok(t)
            tokens.append(s)
            offsets.append(offset)
            offset += len(s)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.token_logprob for lp in lps],
            "top_logprobs": [{self._tok(i): v for i, v in zip(lp.top_ids, lp.top_logprobs)} for lp in lps],
            "text_offset": offsets,
        }

    def _usage(self, states: list[ChoiceState]) -> dict:
        prompt = sum(len(ids) for ids in self.job.prompt_ids)
        completion = sum(len(s.token_ids) for s in states)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.job.response_id, "object": obj, "created": self.job.created, "model": self.model,
                "choices": choices}

    # --- whole response -----------------------------------------------------------------------
    def response(self, states: list[ChoiceState]) -> dict:
        choices = []
        for i, s in enumerate(states):
            lp = self._logprobs(s.token_ids, s.logprobs)
            if self.chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": "".join(s.text)},
                                "logprobs": lp, "finish_reason": s.finish_reason})
            else:
                choices.append({"index": i, "text": "".join(s.text), "logprobs": lp, "finish_reason": s.finish_reason})
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        body["usage"] = self._usage(states)
        return body

    # --- streaming ----------------------------------------------------------------------------
    def _chunk(self, c: int, out: StepOutput | None, state: ChoiceState) -> dict:
        text = out.new_text if out else ""
        ids = out.new_token_ids if out else []
        lp = self._logprobs(ids, out.new_logprobs or [], sum(len(t) for t in state.text)) if out and ids else None
        finish = out.finish_reason if out else None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if out is None else ({"content": text} if text else {})
            choice = {"index": c, "delta": delta, "logprobs": lp, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice])
        return self._envelope("text_completion", [{"index": c, "text": text, "logprobs": lp, "finish_reason": finish}])

    async def sse(self, first, stream: AsyncIterator, observer) -> AsyncIterator[bytes]:
        states = [ChoiceState() for _ in range(len(self.job.prompt_ids) * self.job.request.params.n)]
        try:
            if self.chat:
                for c in range(len(states)):
                    yield _sse(self._chunk(c, None, states[c]))
            pending = [first] if first is not None else []
            while True:
                item = pending.pop() if pending else await anext(stream, None)
                if item is None:
                    break
                c, out = item
                if out.new_token_ids:
                    observer.token(c)
                chunk = self._chunk(c, out, states[c])
                states[c].add(out)
                if out.new_text or out.finished or chunk["choices"][0]["logprobs"] is not None:
                    yield _sse(chunk)
            if self.job.request.include_usage:
                usage = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
                usage["usage"] = self._usage(states)
                yield _sse(usage)
        except ApiError as exc:
            yield _sse(exc.body())
        except Exception:
            yield _sse(internal_error().body())
        finally:
            await stream.aclose()
            observer.done(states)
        yield DONE
