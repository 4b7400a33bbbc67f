"""The engine: admit requests, step the model, turn samples into outputs, release.

With speculative decoding a step may emit several tokens for one request (accepted drafts plus one
sampled token); stop checks run token by token and cut the output at the first stop.

    step():  _propose() -> scheduler.schedule() -> executor.execute() -> scheduler.update_from_output()
             -> [StepOutput]

Every way a request ends (stop, length, abort, error) goes through `_release`, which frees and
zeroes its KV blocks, drops its sampler generator and detokenizer state, and wipes its tokens.
The engine is given its parts (the model executor, the KV cache tensors, the tokenizer, the offload
store: `EngineParts`) by whoever builds it (entrypoints/build.py); engine/ itself imports no torch.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

from traceless.config import EngineConfig
from traceless.engine.block_pool import BlockPool
from traceless.engine.detokenizer import IncrementalDetokenizer
from traceless.engine.kv_manager import KVCacheManager
from traceless.engine.prefix_cache import PrefixCacheConfig, domain_of
from traceless.engine.request import Request, RequestStatus
from traceless.engine.run_ahead import InFlight, is_plain
from traceless.engine.scheduler import Scheduler, SchedulerConfig, TokenUpdate
from traceless.engine.speculative import NgramProposer, SpecStats, SpeculativeConfig
from traceless.engine.step_io import EngineParts, ModelInfo, SampledTokens, SchedulerOutput, TokenLogprobs
from traceless.errors import ContextLengthError, InvalidRequestError, QueueFullError
from traceless.events import emit
from traceless.modes import SpecMode
from traceless.sampling_params import SamplingParams
from traceless.structured.grammar import GrammarCompiler, Guide


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one step produced for one request: deltas since the last StepOutput."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[TokenLogprobs] | None  # when the request asked for logprobs
    finish_reason: str | None
    stop_reason: str | int | None
    num_prompt_tokens: int
    num_output_tokens: int
    # With the request's first tokens, when it asked for them: prompt token k + 1 scored at position
    # k (P - 1 entries; the first prompt token has none).
    prompt_logprobs: list[TokenLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class IntegrityError(AssertionError):
    pass


@dataclass(frozen=True, slots=True)
class KVStats:
    """KV cache counters since the engine started (numbers only)."""

    usage: float  # fraction of blocks in use now
    cached_blocks: int  # blocks resident in the prefix cache now
    preemptions: int
    offload_bytes_out: int  # KV sealed by offload
    offload_bytes_in: int  # KV restored from offload


@dataclass(frozen=True, slots=True)
class ResidueStats:
    """What the engine still holds, as counts: for allowlisted metrics and residue audits."""

    requests: int
    nonzero_blocks: int  # KV blocks whose memory is not all zeros (a scan of the cache tensors)
    cached_blocks: int  # blocks resident in the prefix cache (non-zero until they expire)
    swapped_requests: int  # requests whose KV is sealed in the offload store


class LLMEngine:
    """Public surface: `model`, `tokenizer`, `max_model_len`, admission (`add_request`, `abort`),
    `step`, counts and cache statistics, `check_integrity`. Nothing else is for callers."""

    def __init__(self, config: EngineConfig, parts: EngineParts):
        self.config = config
        self._parts = parts
        self.model: ModelInfo = parts.model
        self.tokenizer = parts.tokenizer
        self._executor = parts.executor
        self._kv_memory = parts.kv_memory
        self._offload = parts.offload
        self._cache_config = PrefixCacheConfig(
            config.prefix_cache, config.prefix_cache_ttl, self._public_prefixes(config.public_prefixes)
        )
        pool = BlockPool(parts.kv_memory.num_blocks, parts.kv_memory.zero_blocks)
        self._kv = KVCacheManager(pool, config.block_size, self._cache_config, parts.offload, parts.model.kv_windows)
        self._last_expiry = 0.0
        spec = SpeculativeConfig(config.speculative, config.num_speculative_tokens, config.ngram_min, config.ngram_max)
        self._ngram = NgramProposer(spec) if spec.mode is SpecMode.NGRAM else None
        self._scheduler = Scheduler(
            SchedulerConfig(
                config.max_num_seqs,
                config.max_num_batched_tokens,
                self.max_model_len,
                spec.model_drafts,
                parts.model.long_context_from,
            ),
            self._kv,
        )
        self._requests: dict[str, Request] = {}
        self._unreported: set[str] = set()  # ids of the server's own requests: no request events
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self.grammar = GrammarCompiler(self.tokenizer, self.model.vocab_size)  # structured outputs
        self._in_flight = InFlight()  # asynchronous scheduling: the plan launched and not read yet

    @property
    def model_name(self) -> str:
        return self.model.name

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    @property
    def spec_stats(self) -> SpecStats:
        return self._scheduler.spec_stats

    def _public_prefixes(self, texts: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """Token forms of the operator's public prefixes: as a plain prompt and as a chat system message."""
        out = []
        for text in texts:
            out.append(tuple(self.tokenizer.encode(text)))
            if self.tokenizer.chat_template is not None:
                rendered = self.tokenizer.apply_chat_template(
                    [{"role": "system", "content": text}], add_generation_prompt=False
                )
                out.append(tuple(self.tokenizer.encode(rendered, add_special_tokens=False)))
        return tuple(p for p in out if p)

    # --- admission ----------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
        guide: Guide | None = None,
        reported: bool = True,
    ) -> list[int]:
        """Validate, tokenize and queue a request; returns (a copy of) its prompt token ids.
        `reported=False`: the server's own work (the stream ballast), never in request events.
        `cache_salt` names the request's prefix-cache isolation domain (a client secret).
        With `params.structured`, `guide` is the request's matcher, compiled beforehand (the server
        does it on its preparation threads); without one it is compiled here."""
        if guide is not None and params.structured is None:
            raise InvalidRequestError("a grammar guide needs params.structured")
        if request_id in self._requests:
            raise InvalidRequestError("request id is already in use")
        if params.n != 1:
            raise InvalidRequestError("the engine runs n=1 requests; fan out n>1 before adding")
        if len(self._requests) >= self.config.max_queued_requests:
            raise QueueFullError(f"the engine already holds {len(self._requests)} requests")
        ids = self._prompt_ids(prompt)
        if len(ids) >= self.max_model_len:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens; this model's context is {self.max_model_len} tokens "
                "(prompt plus at least one generated token)"
            )
        vocab = self.model.vocab_size
        if any(t >= vocab for t in params.stop_token_ids):
            raise InvalidRequestError(f"stop_token_ids must be below the vocabulary size {vocab}")
        if any(t >= vocab for t, _ in params.logit_bias):
            raise InvalidRequestError(f"logit_bias token ids must be below the vocabulary size {vocab}")
        domain = domain_of(self._cache_config, cache_salt)
        eos = frozenset() if params.ignore_eos else self.tokenizer.eos_ids
        if params.structured is not None and guide is None:
            guide = self.grammar.guide(self.grammar.compile(params.structured))
        request = Request(request_id, ids, params, eos, domain=domain, guide=guide)
        self._requests[request_id] = request
        if not reported:
            self._unreported.add(request_id)
        self._detok[request_id] = IncrementalDetokenizer(self.tokenizer, params.stop, params.skip_special_tokens)
        self._scheduler.add(request)
        return list(ids)

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)):
            if any(isinstance(t, bool) or not isinstance(t, int) for t in prompt):
                raise InvalidRequestError("prompt_token_ids must be a list of integers")
            vocab = self.model.vocab_size
            if any(t < 0 or t >= vocab for t in prompt):
                raise InvalidRequestError(f"prompt_token_ids must be in [0, {vocab})")
            ids = list(prompt)
        else:
            raise InvalidRequestError("a prompt is a string or a list of token ids")
        if not ids:
            raise InvalidRequestError("the prompt is empty")
        return ids

    def abort(self, request_id: str) -> bool:
        request = self._requests.get(request_id)
        if request is None:
            return False
        self._release(request, RequestStatus.FINISHED_ABORTED)
        if not self._requests:  # the step in flight computes for no one now: read (drop) it
            self._read_in_flight()
        self._executor.sweep()
        return True

    def abort_all(self) -> int:
        """Abort every request (shutdown); returns how many there were."""
        ids = list(self._requests)
        for rid in ids:
            self.abort(rid)
        return len(ids)

    def restarted(self) -> LLMEngine:
        """After a failure this engine cannot go on from (an exception out of `step`): release what
        it holds and return a fresh engine over the same parts (model, KV memory, tokenizer). Every
        request is ended through the single release path where it still can be, and otherwise its
        parts are dropped one by one; then every KV block is zeroed, owned, cached or free. Raises
        IntegrityError when per-request state survives all that (the caller then stops serving)."""
        for rid in list(self._requests):
            try:
                self.abort(rid)
            except Exception:  # the failure left this request half-updated: take it apart by hand
                self._drop_remains(rid)
        if self._executor.num_held() or (self._offload is not None and self._offload.num_swapped()):
            raise IntegrityError("per-request state survived the restart")
        self._kv_memory.zero_blocks(list(range(self._kv_memory.num_blocks)))
        return LLMEngine(self.config, self._parts)

    def _drop_remains(self, request_id: str) -> None:
        self._executor.release(request_id)
        if self._offload is not None:
            self._offload.discard(request_id)
        detok = self._detok.pop(request_id, None)
        if detok is not None:
            detok.wipe()
        self._requests.pop(request_id).wipe()

    # --- stepping -----------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self._requests) or bool(self._in_flight)

    def request_ids(self) -> list[str]:
        """The ids of the requests the engine holds (unfinished)."""
        return list(self._requests)

    @property
    def num_running(self) -> int:
        return len(self._scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self._scheduler.waiting)

    def kv_usage(self) -> float:
        return self._kv.pool.usage()

    def kv_group_blocks(self) -> list[int]:
        """KV blocks the requests hold now, per KV group (ModelInfo.kv_windows gives each group's
        window): a windowed group's count stays near its window however long the requests grow."""
        return self._kv.live_blocks_by_group()

    @property
    def num_kv_blocks(self) -> int:
        return self._kv_memory.num_blocks

    def scrub_compute_workers(self) -> None:
        """Clear the dead stacks of the threads the model ran on (call from the engine thread, idle)."""
        self._executor.scrub_workers()

    def count_nonzero_blocks(self, start: int, end: int) -> int:
        """How many of KV blocks [start, end) hold any non-zero value (a slice of an idle scan)."""
        return self._kv_memory.count_nonzero(start, end)

    def cached_prefix_len(self, token_ids: list[int], cache_salt: str | None = None) -> int:
        """How many leading tokens a request with these tokens and this salt would take from the
        prefix cache now (a count; nothing is taken)."""
        probe = Request(
            "probe", token_ids, SamplingParams(), frozenset(), domain=domain_of(self._cache_config, cache_salt)
        )
        limit = self._scheduler.config.long_context_from
        probe.long_context = limit is not None and len(token_ids) > limit
        try:
            hit = self._kv.prefix_hit(probe)
            return hit.num_blocks * self.config.block_size if hit is not None else 0
        finally:
            probe.wipe()

    def kv_stats(self) -> KVStats:
        off = self._offload
        return KVStats(
            self._kv.pool.usage(),
            len(self._kv.pool.cached),
            self._scheduler.num_preemptions,
            off.bytes_out if off is not None else 0,
            off.bytes_in if off is not None else 0,
        )

    def tick(self, now: float | None = None) -> None:
        """Housekeeping between steps: expire (and zero) prefix-cache blocks past their TTL."""
        now = time.monotonic() if now is None else now
        if self._kv.caching and now - self._last_expiry >= 0.5:
            self._last_expiry = now
            if self._kv.pool.expire(self._cache_config.ttl_s, now):
                self._executor.sweep()

    def drop_prefix_cache(self) -> int:
        """Evict and zero every cached block that no running request holds (shutdown, tests)."""
        dropped = self._kv.pool.drop_cache()
        self._executor.sweep()
        return dropped

    def step(self) -> list[StepOutput]:
        try:
            return self._step_ahead() if self.config.async_scheduling else self._step()
        finally:  # once per step, however it ended: zero what the step's releases left on the device
            self._executor.sweep()

    def _step(self) -> list[StepOutput]:
        self.tick()
        self._propose()
        plan = self._scheduler.schedule()
        failed = self._restore_failures()
        if not plan.seqs:
            self._scheduler.drop_plan(plan)
            return failed
        return failed + self._read(plan, lambda: self._executor.execute(plan))

    def _read(self, plan: SchedulerOutput, sampled: Callable[[], dict[str, SampledTokens]]) -> list[StepOutput]:
        """A step's tokens into its requests (sampled() runs it, or waits for it); the plan wiped."""
        try:
            got = sampled()
        except Exception as exc:  # the batch fails; the engine and every other request go on
            emit(
                "engine.step_failed",
                num_requests=len(plan.seqs),
                error_kind="internal" if not isinstance(exc, MemoryError) else "model_error",
            )
            self._scheduler.drop_plan(plan)
            batch = [self._requests[s.request_id] for s in plan.seqs if s.request_id in self._requests]
            return [self._finish(TokenUpdate(r, [], "", None, RequestStatus.FINISHED_ERROR)) for r in batch]
        finally:
            plan.wipe()
        updates = self._scheduler.update_from_output(plan, got, self._stop)
        return [self._output(u) if u.status is None else self._finish(u) for u in updates]

    def _read_in_flight(self) -> list[StepOutput]:
        taken = self._in_flight.take()
        return self._read(*taken) if taken is not None else []

    def _step_ahead(self) -> list[StepOutput]:
        """Asynchronous scheduling (engine/run_ahead.py): launch this step, then read the last one."""
        self.tick()
        out: list[StepOutput] = []
        plain = (
            self._ngram is None
            and self._scheduler.config.model_drafts == 0
            and all(is_plain(r) for r in self._requests.values())
        )
        if self._in_flight and not (plain and self._scheduler.can_run_ahead()):
            out += self._read_in_flight()
        self._propose()
        plan = self._scheduler.schedule()
        out = self._restore_failures() + out
        if not plan.seqs:
            self._scheduler.drop_plan(plan)
            return out + self._read_in_flight()
        if not plain:  # nothing is in flight (read above): a synchronous step
            return out + self._read(plan, lambda: self._executor.execute(plan))
        try:
            launched = self._executor.launch(plan)
        except Exception as exc:
            out += self._read_in_flight()
            return out + self._read(plan, functools.partial(_reraise, exc))  # the batch fails as a step does
        out += self._read_in_flight()
        self._in_flight.hold(plan, launched)
        if not self._requests:  # every request ended with the last step: nothing stays in flight
            out += self._read_in_flight()
        return out

    def _restore_failures(self) -> list[StepOutput]:
        """End the requests whose KV failed to spill or restore (finish_reason "error")."""
        failed = self._scheduler.take_failed()
        return [self._finish(TokenUpdate(r, [], "", None, RequestStatus.FINISHED_ERROR)) for r in failed]

    def _propose(self) -> None:
        """Prompt lookup for every decoding request, from its own tokens only."""
        if self._ngram is None:
            return
        for request in self._scheduler.running:
            if request.num_tokens - request.num_computed_tokens == 1:
                drafts = self._ngram.propose(request)
                if request.guide is not None and drafts:  # only drafts the grammar allows are verified
                    del drafts[request.guide.valid_prefix(drafts) :]
                request.set_drafts(drafts)

    def _stop(self, request: Request, token_id: int) -> tuple[RequestStatus | None, str]:
        """Whether token_id (just appended) ends the request, and the text it adds."""
        p = request.params
        guide = request.guide
        if guide is not None and not guide.accept(token_id):  # the runner's mask makes this unreachable
            emit("engine.grammar_rejected_token")
            return RequestStatus.FINISHED_ERROR, ""
        if token_id in request.eos_token_ids or token_id in p.stop_token_ids:
            request.stop_reason = None if token_id in request.eos_token_ids else token_id
            return RequestStatus.FINISHED_STOPPED, ""
        text, stop = self._detok[request.request_id].add(token_id)
        if stop is not None:
            request.stop_reason = stop
            return RequestStatus.FINISHED_STOPPED, text
        if guide is not None and guide.is_stopped:  # the grammar is complete: nothing may follow
            return RequestStatus.FINISHED_STOPPED, text
        if (
            p.max_tokens is not None and request.num_output_tokens >= p.max_tokens
        ) or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH, text
        return None, text

    @staticmethod
    def _output(u: TokenUpdate) -> StepOutput:
        r = u.request
        return StepOutput(
            r.request_id,
            u.token_ids,
            u.text,
            u.logprobs,
            None,
            None,
            r.num_prompt_tokens,
            r.num_output_tokens,
            r.take_prompt_logprobs(),
        )

    def _finish(self, u: TokenUpdate) -> StepOutput:
        request, status = u.request, u.status
        if status is None:
            raise RuntimeError(f"request {request.request_id} has not finished")
        detok = self._detok.get(request.request_id)
        tail = detok.flush() if detok is not None else ""  # empty after a stop-string match
        out = StepOutput(
            request.request_id,
            u.token_ids,
            u.text + tail,
            u.logprobs,
            status.finish_reason,
            request.stop_reason,
            request.num_prompt_tokens,
            request.num_output_tokens,
            request.take_prompt_logprobs() if u.token_ids else None,
        )
        self._release(request, status)
        return out

    def _release(self, request: Request, status: RequestStatus) -> None:
        """The single exit of every request."""
        self._scheduler.finish(request, status)
        self._executor.release(request.request_id)
        detok = self._detok.pop(request.request_id, None)
        if detok is not None:
            detok.wipe()
        del self._requests[request.request_id]
        if request.request_id in self._unreported:
            self._unreported.discard(request.request_id)
        elif self.config.request_events:  # a benchmark's switch: exact figures of one request, off by default
            now, first = time.monotonic(), request.first_token_time
            emit(
                "request.finished",
                finish=status.finish_reason,
                prompt_tokens=request.num_prompt_tokens,
                output_tokens=request.num_output_tokens,
                ttft_s=(first - request.arrival_time) if first else 0.0,
                e2e_s=now - request.arrival_time,
            )
        request.wipe()

    def residue_stats(self, nonzero_blocks: int | None = None) -> ResidueStats:
        """What the engine holds, as counts. Without `nonzero_blocks` (from a sliced idle scan) the
        whole KV cache is read here: call it when idle."""
        if nonzero_blocks is None:
            nonzero_blocks = len(self._kv_memory.nonzero_blocks())
        return ResidueStats(
            len(self._requests),
            nonzero_blocks,
            len(self._kv.pool.cached),
            self._offload.num_swapped() if self._offload is not None else 0,
        )

    # --- integrity ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise IntegrityError unless the engine holds nothing: no request, no owned or non-zero
        KV block, no sampler or detokenizer state. Tests call this after the work ends."""
        problems = list(self._kv.check_integrity())
        if self._requests or self._detok:
            problems.append(f"{len(self._requests)} request(s) retained")
        if self._scheduler.num_unfinished:
            problems.append("scheduler queues are not empty")
        if self._in_flight:
            problems.append("a step is still in flight")
        if self._executor.num_held():
            problems.append("sampler generators retained")
        dirty = self._kv_memory.nonzero_blocks()
        if dirty:
            problems.append(f"{len(dirty)} KV block(s) hold non-zero values")
        if self._kv.pool.num_free_blocks != self._kv.pool.num_usable_blocks:
            problems.append("not every KV block is free")
        if problems:
            raise IntegrityError("; ".join(problems))


def _reraise(exc: Exception) -> dict[str, SampledTokens]:
    """A launch that failed, read as a failed step."""
    raise exc
