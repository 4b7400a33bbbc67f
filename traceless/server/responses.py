"""OpenAI response bodies and SSE chunks for completions and chat completions.

With tools (tool_choice other than none) a chat choice's text goes through the parser of the
model's call format (tools.py): calls become `message.tool_calls` (streamed: one `tool_calls` delta
per call, with its id, name and whole arguments, once the call is complete), the rest stays content, and a choice that
called a tool and stopped reports finish_reason "tool_calls".
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

from traceless.engine.llm_engine import StepOutput
from traceless.http.errors import ApiError, internal_error
from traceless.server.stream_shape import StreamShape, pad_event
from traceless.server.tools import ToolFormat, ToolParser, finish_parser, new_parser, parse_all


@dataclass(slots=True)
class ChoiceState:
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)  # TokenLogprobs per generated token
    finish_reason: str | None = None
    prompt_logprobs: list | None = None  # TokenLogprobs per prompt position after the first
    echoed: bool = False  # streaming: the prompt went out with the choice's first chunk
    parser: ToolParser | None = None  # streamed chat with tools
    num_calls: int = 0  # tool calls streamed so far

    def add(self, out: StepOutput) -> None:
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        self.text.append(out.new_text)
        self.token_ids.extend(out.new_token_ids)
        if out.new_logprobs:
            self.logprobs.extend(out.new_logprobs)
        if out.finished:
            self.finish_reason = out.finish_reason


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def merge(outs: list[StepOutput]) -> StepOutput:
    """Several step outputs of one choice as one (for grouped streaming)."""
    if len(outs) == 1:
        return outs[0]
    last = outs[-1]
    lps = [lp for o in outs for lp in (o.new_logprobs or [])]
    prompt_lps = next((o.prompt_logprobs for o in outs if o.prompt_logprobs is not None), None)
    return StepOutput(
        last.request_id,
        [t for o in outs for t in o.new_token_ids],
        "".join(o.new_text for o in outs),
        lps or None,
        last.finish_reason,
        last.stop_reason,
        last.num_prompt_tokens,
        last.num_output_tokens,
        prompt_lps,
    )


class Formatter:
    def __init__(self, job, model_name: str, tokenizer, shape: StreamShape = StreamShape()):
        self.job = job
        self.chat = job.kind == "chat_completions"
        self.model = model_name
        self.tokenizer = tokenizer
        self.shape = shape
        tools = job.request.tools if self.chat else None
        self.tools = tools is not None and tools.parses_calls
        self.tool_format = tools.format if tools is not None else ToolFormat.HERMES

    def _event(self, obj: dict) -> bytes:
        return pad_event(_sse(obj), self.shape.padding)

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
                top = [
                    {"token": self._tok(i), "logprob": v, "bytes": list(self._tok(i).encode())}
                    for i, v in zip(lp.top_ids, lp.top_logprobs)
                ]
                content.append(
                    {"token": s, "logprob": lp.token_logprob, "bytes": list(s.encode()), "top_logprobs": top}
                )
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

    # --- echo and prompt logprobs (completions) ---------------------------------------------------
    def _prompt_text(self, c: int) -> str:
        p = self.job.request.prompts[c // self.job.request.params.n]
        return p if isinstance(p, str) else self.tokenizer.decode(list(p), skip_special_tokens=False)

    def _echo(self, c: int, prompt_lps: list | None, out_lp: dict | None) -> tuple[str, dict | None]:
        """The prompt's text and, with logprobs, its tokens and logprobs (the first token's null)
        followed by the output's (whose text offsets start past the prompt: _echo_offset)."""
        text = self._prompt_text(c)
        if self.job.request.logprobs is None:
            return text, out_lp
        ids = self.job.prompt_ids[c // self.job.request.params.n]
        if prompt_lps is None or len(prompt_lps) != len(ids) - 1:
            raise RuntimeError("the engine returned no prompt logprobs for an echo request")
        tokens = [self._tok(t) for t in ids]
        offsets, offset = [], 0
        for t in tokens:
            offsets.append(offset)
            offset += len(t)
        lp = {
            "tokens": tokens,
            "token_logprobs": [None] + [x.token_logprob for x in prompt_lps],
            "top_logprobs": [None] + [{self._tok(i): v for i, v in zip(x.top_ids, x.top_logprobs)} for x in prompt_lps],
            "text_offset": offsets,
        }
        if out_lp is not None:
            for key in ("tokens", "token_logprobs", "top_logprobs"):
                lp[key] += out_lp[key]
            lp["text_offset"] += out_lp["text_offset"]
        return text, lp

    def _echo_offset(self, c: int) -> int:
        """Where the output's text starts in an echoed choice's text."""
        echo = self.job.request.echo and not self.chat and self.job.request.logprobs is not None
        return len(self._prompt_text(c)) if echo else 0

    def _vllm_prompt_logprobs(self, c: int, prompt_lps: list | None) -> list | None:
        """vLLM's choice field: per prompt token {token id: {logprob, rank, decoded_token}}, None first."""
        ids = self.job.prompt_ids[c // self.job.request.params.n]
        if prompt_lps is None or len(prompt_lps) != len(ids) - 1:
            raise RuntimeError("the engine returned no prompt logprobs for a prompt_logprobs request")
        n = self.job.request.prompt_logprobs or 0
        out: list = [None]
        for t, x in zip(ids[1:], prompt_lps):
            entry = {
                str(i): {"logprob": v, "rank": r, "decoded_token": self._tok(i)}
                for r, (i, v) in enumerate(zip(x.top_ids[:n], x.top_logprobs[:n]), start=1)
            }
            entry[str(t)] = {"logprob": x.token_logprob, "rank": x.token_rank, "decoded_token": self._tok(t)}
            out.append(entry)
        return out

    def _completion_choice(
        self, c: int, text: str, lp: dict | None, finish: str | None, prompt_lps: list | None, first: bool
    ) -> dict:
        if self.job.request.echo and first:
            prefix, lp = self._echo(c, prompt_lps, lp)
            text = prefix + text
        choice = {"index": c, "text": text, "logprobs": lp, "finish_reason": finish}
        if self.job.request.prompt_logprobs is not None and first:
            choice["prompt_logprobs"] = self._vllm_prompt_logprobs(c, prompt_lps)
        return choice

    def _usage(self, states: list[ChoiceState]) -> dict:
        prompt = sum(len(ids) for ids in self.job.prompt_ids)
        completion = sum(len(s.token_ids) for s in states)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {
            "id": self.job.response_id,
            "object": obj,
            "created": self.job.created,
            "model": self.model,
            "choices": choices,
        }

    # --- whole response -----------------------------------------------------------------------
    def response(self, states: list[ChoiceState]) -> dict:
        choices = []
        for i, s in enumerate(states):
            lp = self._logprobs(s.token_ids, s.logprobs, self._echo_offset(i))
            if self.chat:
                message, finish = self._message("".join(s.text), s.finish_reason)
                choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
            else:
                choices.append(
                    self._completion_choice(i, "".join(s.text), lp, s.finish_reason, s.prompt_logprobs, True)
                )
        body = self._envelope("chat.completion" if self.chat else "text_completion", choices)
        body["usage"] = self._usage(states)
        return body

    def _message(self, text: str, finish: str | None) -> tuple[dict, str | None]:
        if not self.tools:
            return {"role": "assistant", "content": text}, finish
        content, calls = parse_all(text, self.tool_format)
        if not calls:
            return {"role": "assistant", "content": content}, finish
        message = {
            "role": "assistant",
            "content": content if content.strip() else None,
            "tool_calls": [call.as_dict() for call in calls],
        }
        return message, _call_finish(finish)

    # --- streaming ----------------------------------------------------------------------------
    def _delta(self, text: str, finished: bool, state: ChoiceState) -> dict:
        if not self.tools:
            return {"content": text} if text else {}
        if state.parser is None:
            state.parser = new_parser(self.tool_format)
        content, calls = state.parser.feed(text)
        if finished:
            rest, more = finish_parser(state.parser)
            content, calls = content + rest, calls + more
        delta: dict = {"content": content} if content else {}
        if calls:
            delta["tool_calls"] = [call.as_dict(state.num_calls + k) for k, call in enumerate(calls)]
            state.num_calls += len(calls)
        return delta

    def _chunk(self, c: int, out: StepOutput | None, state: ChoiceState) -> dict:
        text = out.new_text if out else ""
        ids = out.new_token_ids if out else []
        base = sum(len(t) for t in state.text) + self._echo_offset(c)
        lp = self._logprobs(ids, out.new_logprobs or [], base) if out and ids else None
        finish = out.finish_reason if out else None
        if self.chat:
            if out is None:
                delta: dict = {"role": "assistant", "content": ""}
            else:
                delta = self._delta(text, out.finished, state)
                if state.num_calls:
                    finish = _call_finish(finish)
            choice = {"index": c, "delta": delta, "logprobs": lp, "finish_reason": finish}
            return self._envelope("chat.completion.chunk", [choice])
        first = out is not None and not state.echoed
        if first:
            state.echoed = True
        prompt_lps = out.prompt_logprobs if out else None
        return self._envelope("text_completion", [self._completion_choice(c, text, lp, finish, prompt_lps, first)])

    async def sse(self, first, stream: AsyncGenerator, observer) -> AsyncGenerator[bytes, None]:
        states = [ChoiceState() for _ in range(len(self.job.prompt_ids) * self.job.request.params.n)]
        try:
            async with aclosing(self._events(first, stream, states, observer)) as events:
                async for event in events:
                    yield event
        except ApiError as exc:
            yield self._event(exc.body())
        except Exception:
            yield self._event(internal_error().body())
        finally:
            await stream.aclose()
            observer.done(states)
        yield pad_event(DONE, self.shape.padding)

    async def _events(
        self, first, stream: AsyncGenerator, states: list[ChoiceState], observer
    ) -> AsyncGenerator[bytes, None]:
        """The stream's events before [DONE]: a chat's role chunks, a chunk per group of tokens (the
        stream interval), the usage chunk when asked for."""
        pending: dict[int, list[StepOutput]] = {}
        if self.chat:
            for c in range(len(states)):
                yield self._event(self._chunk(c, None, states[c]))
        queued = [first] if first is not None else []
        while True:
            item = queued.pop() if queued else await anext(stream, None)
            if item is None:
                break
            c, out = item
            if out.new_token_ids:
                observer.token(c)
            group = pending.setdefault(c, [])
            group.append(out)
            if sum(len(o.new_token_ids) for o in group) < self.shape.interval and not out.finished:
                continue  # hold tokens until the group is full (stream interval)
            event = self._group_event(c, group, states[c])
            if event is not None:
                yield event
        if self.job.request.include_usage:
            usage = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
            usage["usage"] = self._usage(states)
            yield self._event(usage)

    def _group_event(self, c: int, group: list[StepOutput], state: ChoiceState) -> bytes | None:
        """One choice's held outputs merged into a chunk (the group emptied), or None when the chunk
        would say nothing."""
        merged = merge(group)
        group.clear()
        chunk = self._chunk(c, merged, state)
        state.add(merged)
        ch = chunk["choices"][0]
        # a chat delta may carry only a tool call; an echoed completion chunk only the prompt
        if ch.get("delta", merged.new_text) or merged.finished or ch["logprobs"] is not None or ch.get("text"):
            return self._event(chunk)
        return None


def _call_finish(finish: str | None) -> str | None:
    """A choice that called a tool and stopped finishes with "tool_calls" (cut by length: "length")."""
    return "tool_calls" if finish == "stop" else finish
