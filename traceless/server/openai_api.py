"""The OpenAI API over an AsyncEngine, independent of the HTTP framework.

`completions(body)` / `chat(body)` take a parsed JSON body and return either a response dict or
an async iterator of SSE bytes. The plaintext server (app.py) and the private node (OHTTP) both
call these. One request with P prompts and n completions each runs P*n engine requests (at most
protocol.MAX_CHOICES); choice c uses prompt c // n and, with a seed, seed + c % n.

Preparing a request (validation, chat templating, tokenization) costs CPU in proportion to the
prompt, so it runs on a small thread pool, never on the event loop: one large prompt does not
stall every other connection.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from traceless.engine.llm_engine import StepOutput
from traceless.errors import TracelessError
from traceless.http.errors import ApiError, from_traceless_error
from traceless.server.async_engine import AsyncEngine
from traceless.server.prep_threads import PrepThreads
from traceless.server.protocol import (
    ParsedRequest,
    parse_chat,
    parse_completion,
    parse_detokenize,
    parse_tokenize,
)
from traceless.server.responses import ChoiceState, Formatter
from traceless.server.stream_shape import StreamShape
from traceless.server.telemetry import Telemetry
from traceless.server.thread_cache import scrub_thread
from traceless.server.tools import check_template, for_template, tool_format
from traceless.structured.grammar import Guide

PREP_THREADS = 2  # request preparation (templating, tokenization) runs here, off the event loop


@dataclass(frozen=True, slots=True)
class Job:
    kind: str  # "completions" | "chat_completions"
    request: ParsedRequest
    prompt_ids: list[list[int]]
    response_id: str
    created: int
    guides: list[Guide] | None = None  # structured outputs: one matcher per choice, compiled off the loop


class OpenAIService:
    def __init__(self, engine: AsyncEngine, model_name: str, telemetry: Telemetry, shape: StreamShape = StreamShape()):
        self.engine = engine
        self.shape = shape
        self.model_name = model_name
        self.telemetry = telemetry
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self._prep = PrepThreads(PREP_THREADS, "traceless-prep")
        engine.on_idle(self._scrub_thread_caches)

    def _scrub_thread_caches(self) -> None:
        """Once quiet: the allocator caches and dead stacks of the threads that held request text
        (this event loop's and the preparation threads') are overwritten."""
        scrub_thread()
        try:
            self._prep.scrub()
        except RuntimeError:  # the pool is shut down (the app is stopping): its threads are gone
            pass

    def close(self) -> None:
        """Stop the preparation threads (the app's shutdown)."""
        self._prep.shutdown(wait=False, cancel_futures=True)

    def handlers(self) -> dict[str, Callable]:
        """The work of each route in http/openai_routes.py, by its name: a GET's takes nothing and
        returns JSON; a POST's takes the parsed body and is awaited."""
        return {
            "models": self.models,
            "tokenizer_info": self.tokenizer_info,
            "tokenize": self.tokenize,
            "detokenize": self.detokenize,
            "completions": self.completions,
            "chat_completions": self.chat,
        }

    def models(self) -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "traceless",
                    "max_model_len": self.max_model_len,
                }
            ],
        }

    def tokenizer_info(self) -> dict:
        """vLLM's /tokenizer_info (what lm-evaluation-harness's remote tokenizer reads): the model's
        special tokens and chat template; operator data, no request content."""
        tok = self.tokenizer
        return {
            "tokenizer_class": "traceless",
            "model_max_length": self.max_model_len,
            "bos_token": tok.token_text(tok.bos_id) if tok.bos_id is not None else None,
            "eos_token": tok.token_text(min(tok.eos_ids)) if tok.eos_ids else None,
            "pad_token": None,
            "chat_template": tok.chat_template,
        }

    async def tokenize(self, body) -> dict:
        """vLLM's /tokenize: {count, max_model_len, tokens, token_strs}."""
        return await asyncio.get_running_loop().run_in_executor(self._prep, self._tokenize, body)

    async def detokenize(self, body) -> dict:
        """vLLM's /detokenize: {prompt}."""
        return await asyncio.get_running_loop().run_in_executor(self._prep, self._detokenize, body)

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise ApiError(404, "the model does not exist on this server", param="model", code="model_not_found")

    def _tokenize(self, body) -> dict:
        req = parse_tokenize(body)
        self._check_model(req.model)
        text = req.prompt
        if req.messages is not None:
            try:
                text = self.tokenizer.apply_chat_template(req.messages, req.add_generation_prompt)
            except TracelessError as exc:
                raise from_traceless_error(exc) from None
        ids = self.tokenizer.encode(text or "", add_special_tokens=req.add_special_tokens)
        strs = [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids] if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs}

    def _detokenize(self, body) -> dict:
        model, ids = parse_detokenize(body, self.engine.model.vocab_size)
        self._check_model(model)
        return {"prompt": self.tokenizer.decode(ids, skip_special_tokens=False)}

    async def completions(self, body) -> dict | AsyncGenerator[bytes, None]:
        try:
            return await self._run(await self._prepare(self._completion_job, body))
        finally:
            self.engine.note_activity()

    async def chat(self, body) -> dict | AsyncGenerator[bytes, None]:
        try:
            return await self._run(await self._prepare(self._chat_job, body))
        finally:
            self.engine.note_activity()

    async def _prepare(self, make: Callable[[object], Job], body) -> Job:
        return await asyncio.get_running_loop().run_in_executor(self._prep, make, body)

    def _completion_job(self, body) -> Job:
        req = parse_completion(body)
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in req.prompts]
        return Job("completions", req, ids, f"cmpl-{uuid.uuid4().hex}", int(time.time()), self._guides(req, len(ids)))

    def _guides(self, req: ParsedRequest, num_prompts: int) -> list[Guide] | None:
        """Compile the request's grammar (bounded; a refusal is a 400) and make each choice's matcher."""
        spec = req.params.structured
        if spec is None:
            return None
        try:
            compiled = self.engine.grammar.compile(spec)
            return [self.engine.grammar.guide(compiled) for _ in range(num_prompts * req.params.n)]
        except TracelessError as exc:
            raise from_traceless_error(exc) from None

    def _chat_job(self, body) -> Job:
        template = self.tokenizer.chat_template

        def render(messages, tools):
            try:
                return self.tokenizer.apply_chat_template(for_template(messages, template), tools=tools)
            except TracelessError as exc:
                raise from_traceless_error(exc) from None

        req = parse_chat(body, render, tool_format(template))
        if req.tools is not None:
            check_template(req.tools, template)
        prompt = req.prompts[0]
        if not isinstance(prompt, str):  # parse_chat renders the conversation to text
            raise RuntimeError("a chat request's prompt is not rendered text")
        ids = [self.tokenizer.encode(prompt, add_special_tokens=False)]
        return Job("chat_completions", req, ids, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), self._guides(req, 1))

    # -------------------------------------------------------------------------------------------
    def _check(self, job: Job) -> None:
        if job.request.model != self.model_name:
            raise ApiError(404, "the model does not exist on this server", param="model", code="model_not_found")
        max_tokens = job.request.params.max_tokens
        for ids in job.prompt_ids:
            if not ids:
                raise ApiError(400, "the prompt is empty", param="prompt")
            if len(ids) >= self.max_model_len or (
                max_tokens is not None and len(ids) + max_tokens > self.max_model_len
            ):
                raise ApiError(
                    400,
                    f"this model's maximum context length is {self.max_model_len} tokens; the request "
                    f"has {len(ids)} prompt tokens and asks for {max_tokens or 1} more",
                    param="max_tokens" if max_tokens else "prompt",
                    code="context_length_exceeded",
                )

    async def _run(self, job: Job):
        self._check(job)
        n = job.request.params.n
        children = []
        for c in range(len(job.prompt_ids) * n):
            ids = job.prompt_ids[c // n]
            params = job.request.params.with_seed_offset(c % n) if n > 1 else job.request.params
            if params.max_tokens is None:
                params = _replace_max_tokens(params, self.max_model_len - len(ids))
            guide = job.guides[c] if job.guides is not None else None
            children.append((f"{job.response_id}-{c}", ids, params, job.request.cache_salt, guide))
        stream = self._merged(job, children)
        fmt = Formatter(job, self.model_name, self.tokenizer, self.shape)
        if job.request.stream:
            first = await _first_or_error(stream)  # validation errors become HTTP errors, not broken streams
            return fmt.sse(first, stream, self._observe(job))
        states = [ChoiceState() for _ in children]
        async for c, out in stream:
            states[c].add(out)
        self._record(job, states)
        return fmt.response(states)

    async def _merged(self, job: Job, children) -> AsyncGenerator[tuple[int, StepOutput], None]:
        """(choice index, output) pairs of all children as they come; closing it aborts them all."""
        q: asyncio.Queue = asyncio.Queue()

        async def pump(c, rid, ids, params, salt, guide):
            try:
                async for out in self.engine.generate(rid, ids, params, salt, guide):
                    q.put_nowait((c, out))
            except BaseException as exc:  # includes validation errors from the engine
                q.put_nowait((c, exc))
                raise
            finally:
                q.put_nowait((c, None))

        tasks = [asyncio.create_task(pump(c, *child)) for c, child in enumerate(children)]
        live = len(tasks)
        try:
            while live:
                c, item = await q.get()
                if item is None:
                    live -= 1
                elif isinstance(item, BaseException):
                    raise from_traceless_error(item) if isinstance(item, TracelessError) else item
                else:
                    yield c, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _record(self, job: Job, states: list[ChoiceState]) -> None:
        """The job's figures, into the telemetry window (never published on their own)."""
        self.telemetry.finished(
            [s.finish_reason for s in states if s.finish_reason is not None],
            sum(len(i) for i in job.prompt_ids),
            sum(len(s.token_ids) for s in states),
        )

    def _observe(self, job: Job):
        """Per-stream telemetry hooks for the SSE formatter."""
        return StreamObserver(self, job)


class StreamObserver:
    def __init__(self, service: OpenAIService, job: Job):
        self.service, self.job = service, job
        self.t0 = time.monotonic()
        self.last: dict[int, float] = {}
        self.first = True

    def token(self, c: int) -> None:
        now = time.monotonic()
        t = self.service.telemetry
        if self.first:
            t.ttft(now - self.t0)
            self.first = False
        elif c in self.last:
            t.itl(now - self.last[c])
        self.last[c] = now

    def done(self, states: list[ChoiceState]) -> None:
        self.service._record(self.job, states)


async def _first_or_error(stream: AsyncGenerator):
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None
    except BaseException:
        await stream.aclose()
        raise


def _replace_max_tokens(params, max_tokens: int):
    from dataclasses import replace

    return replace(params, max_tokens=max_tokens)


def dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
