"""Continuous batching with chunked prefill. No torch.

One rule covers prefill, chunked prefill and decode: each step, every scheduled request's
num_computed_tokens moves toward num_tokens by as many tokens as the step's budget allows.
Order is first come, first served, with no priority classes (routing and scheduling never read
who the user is or what they wrote). Running requests are served before waiting ones; when
blocks run out, the most recently arrived running request is preempted: by recompute (its blocks are freed and
zeroed and it goes back to the front of the queue with num_computed_tokens = 0) or, with KV
offload, by swapping (its KV is sealed outside the pool and restored when it resumes).
Speculative decoding fits the same rule: a decoding request with d draft tokens is scheduled for
1 + d tokens (its last sampled token plus the drafts), d capped by the budget, max_tokens and the
context. Drafts never cost a preemption: without room for them the request decodes one token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from traceless.engine.kv_manager import KVCacheManager
from traceless.engine.request import Request, RequestStatus
from traceless.engine.speculative import SpecStats
from traceless.engine.step_io import SampledTokens, ScheduledSeq, SchedulerOutput, TokenLogprobs
from traceless.errors import KVRestoreError, KVSpillError
from traceless.events import emit


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    model_drafts: int = 0  # draft positions per decoding request for drafts the model makes in the step
    # LongRoPE's original context: a request longer than this is computed, all of it, on the long factors
    long_context_from: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 2:
            raise ValueError("max_num_seqs, max_num_batched_tokens must be >= 1 and max_model_len >= 2")
        if self.model_drafts < 0:
            raise ValueError("model_drafts must be >= 0")


@dataclass(frozen=True, slots=True)
class _Chunk:
    """num_new_tokens from the request's num_computed_tokens on; the last num_draft_tokens of them
    are drafts (the request's own, or made by the model in the step) that the step verifies."""

    request: Request
    num_new_tokens: int
    num_draft_tokens: int
    start: int  # the first position computed (beyond num_computed_tokens when running ahead)
    completes_sequence: bool  # after it every known token is computed: the step samples a new one


def _chunk(request: Request, n: int, d: int = 0, ahead: int = 0, ahead_sampled: int = 0) -> _Chunk:
    """n tokens (the last d of them drafts) of the request. Running ahead, a plan in flight
    computes `ahead` tokens before them and samples `ahead_sampled` (known on the device only)."""
    start = request.num_computed_tokens + ahead
    return _Chunk(request, n, d, start, start + n - d == request.num_tokens + ahead_sampled)


@dataclass(slots=True)
class _Preempted:
    """Requests taken off the batch in one step, and how many of them had their KV spilled."""

    requests: int = 0
    spilled: int = 0


@dataclass(frozen=True, slots=True)
class TokenUpdate:
    """What a step added to one request: its new tokens (cut at the first stop), their text and
    logprobs, and the status it finished with (None while it runs on)."""

    request: Request
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprobs] | None
    status: RequestStatus | None


# (request, token id just appended) -> (the status it finishes with or None, text it adds)
StopCheck = Callable[[Request, int], tuple[RequestStatus | None, str]]


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.spec_stats = SpecStats()
        self.num_preemptions = 0
        # The chunks of the plans the runner is executing, by plan: one, or two while the engine
        # runs ahead (the last plan launched before the previous one's tokens were read).
        self._inflight: dict[int, dict[str, _Chunk]] = {}
        self._step = 0
        self._failed: list[Request] = []  # could not be swapped out or resume this step (KV spill/restore failed)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def _ahead(self) -> dict[str, tuple[int, int]]:
        """Request id -> (tokens computed, tokens sampled) by the plans in flight: how far its
        counts will move once the runner's results are read (running ahead)."""
        out: dict[str, tuple[int, int]] = {}
        for chunks in self._inflight.values():
            for rid, c in chunks.items():
                computed, sampled = out.get(rid, (0, 0))
                out[rid] = (computed + c.num_new_tokens - c.num_draft_tokens, sampled + c.completes_sequence)
        return out

    def drop_plan(self, plan: SchedulerOutput) -> None:
        """Forget a plan whose results will never be read (its step failed, or it was empty)."""
        self._inflight.pop(plan.step, None)

    def can_run_ahead(self) -> bool:
        """Whether the next schedule() is certain to preempt no one: the blocks every running
        request may need for its next chunk (counting tokens in flight) are free. Preemption
        changes a request's counts under a plan in flight, so the engine reads the plan's results
        first when this is False."""
        budget, need = self.config.max_num_batched_tokens, 0
        ahead = self._ahead()
        limit = self.config.long_context_from
        for request in self.running:
            computed, sampled = ahead.get(request.request_id, (0, 0))
            if limit is not None and not request.long_context and request.num_tokens + sampled + 1 > limit:
                return False  # LongRoPE's switch recomputes the request's KV: never under a plan in flight
            start = request.num_computed_tokens + computed
            n = min(request.num_tokens + sampled - start, budget)
            if n <= 0:
                continue
            budget -= n
            need += self.kv.blocks_to_reach(request.request_id, start + n)
        return need <= self.kv.pool.num_free_blocks

    def schedule(self) -> SchedulerOutput:
        chunks: list[_Chunk] = []
        preempted = _Preempted()
        budget = self._schedule_running(self.config.max_num_batched_tokens, chunks, preempted)
        if not preempted.requests:
            self._admit_waiting(budget, chunks)
        if preempted.requests:
            emit("engine.preempted", num_requests=preempted.requests, spilled=preempted.spilled)
        self._step += 1
        self._inflight[self._step] = {c.request.request_id: c for c in chunks}
        return SchedulerOutput(tuple(self._plan(c) for c in chunks), preempted.requests, self._step)

    def _schedule_running(self, budget: int, chunks: list[_Chunk], preempted: _Preempted) -> int:
        """The running requests' chunks, in order, within `budget` tokens; a request that finds no
        room preempts from the tail of the batch (itself, last). Returns the budget left."""
        in_flight = self._ahead() if self._inflight else {}
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            ahead, ahead_sampled = in_flight.get(request.request_id, (0, 0))
            if ahead:  # run ahead: its counts once the plan in flight is read
                chunk = self._chunk_ahead(request, ahead, ahead_sampled, budget)
            else:
                chunk = self._chunk_running(request, budget, preempted)
                if chunk is None:
                    break  # the request preempted itself: nothing after it runs this step
            if chunk is not None:
                chunks.append(chunk)
                budget -= chunk.num_new_tokens
            i += 1
        return budget

    def _chunk_ahead(self, request: Request, ahead: int, ahead_sampled: int, budget: int) -> _Chunk | None:
        """A request the plan in flight computes `ahead` tokens of; None when it has none beyond them."""
        n = min(request.num_tokens + ahead_sampled - request.num_computed_tokens - ahead, budget)
        if n <= 0:
            return None
        if not self.kv.allocate_slots(request, ahead + n):
            raise RuntimeError("a request running ahead ran out of blocks (can_run_ahead was not asked)")
        return _chunk(request, n, 0, ahead, ahead_sampled)

    def _chunk_running(self, request: Request, budget: int, preempted: _Preempted) -> _Chunk | None:
        """A running request's next tokens, with drafts where they fit; without room, requests are
        preempted from the tail of the batch until they fit, or None once the request itself is."""
        self._check_long_context(request)
        d = self._num_drafts(request, budget)
        n = min(request.num_tokens - request.num_computed_tokens, budget)
        if d and self.kv.allocate_slots(request, n + d):
            return _chunk(request, n + d, d)
        while not self.kv.allocate_slots(request, n):
            victim = self.running.pop()  # always at index >= the request's: not yet scheduled this step
            preempted.spilled += self._preempt(victim)
            preempted.requests += 1
            if victim is request:
                return None
        return _chunk(request, n)

    def _admit_waiting(self, budget: int, chunks: list[_Chunk]) -> None:
        """Waiting requests, in order, while the budget, the batch and the KV blocks have room."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            self._check_long_context(request)
            swapped = self.kv.is_swapped(request)
            # A request starting from scratch (new, or preempted by recompute) first takes the
            # cached blocks of its own domain that hold its leading tokens; a swapped-out one gets
            # its own KV back instead. A request asking for prompt logprobs takes no cached blocks:
            # it needs the logits of every prompt position, so it computes them all.
            fresh = request.num_computed_tokens == 0 and not swapped and request.params.prompt_logprobs is None
            hit = self.kv.prefix_hit(request) if fresh else None
            cached = hit.num_blocks * self.kv.block_size if hit is not None else 0
            n = min(request.num_tokens - request.num_computed_tokens - cached, budget)
            if not self.kv.allocate_slots(request, n, hit):
                break
            if swapped and not self._swap_in(request):
                continue
            request.num_computed_tokens += cached
            self.waiting.popleft()
            request.transition(RequestStatus.RUNNING)
            self.running.append(request)
            chunks.append(_chunk(request, n))
            budget -= n

    def _check_long_context(self, request: Request) -> None:
        """LongRoPE (model/rope.py): once a request is longer than the original context, all of
        its KV must come from the long factors, as transformers recomputes it at that point. KV it
        computed on the short factors is dropped (its blocks freed and zeroed, cached ones stay in
        the cache under the short chain) and recomputed."""
        limit = self.config.long_context_from
        if limit is None or request.long_context or request.num_tokens <= limit:
            return
        request.long_context = True
        if request.num_computed_tokens or self.kv.is_swapped(request):
            self.kv.free(request)
            request.num_computed_tokens = 0

    def _swap_in(self, request: Request) -> bool:
        """Restore a swapped-out request's KV into its fresh blocks. If its sealed KV cannot be
        restored, the request leaves the queue for `take_failed` (the engine ends it through its
        single release path, which zeroes the blocks it was just given); the others go on."""
        try:
            self.kv.swap_in(request)
        except KVRestoreError:
            self.waiting.popleft()
            self._failed.append(request)
            emit("engine.kv_restore_failed", num_requests=1)
            return False
        return True

    def take_failed(self) -> list[Request]:
        """Requests that schedule() could not swap out or resume (their KV failed to spill or restore)."""
        failed, self._failed = self._failed, []
        return failed

    def _plan(self, chunk: _Chunk) -> ScheduledSeq:
        """The runner's copy of a chunk: plain data, wiped after the step."""
        r, p = chunk.request, chunk.request.params
        start = chunk.start
        n_known = chunk.num_new_tokens - chunk.num_draft_tokens
        model_drafts = chunk.num_draft_tokens if self.config.model_drafts else 0
        own = list(r.draft_token_ids[: chunk.num_draft_tokens]) if not model_drafts else []
        needs_out = p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0
        # Prompt logprobs: the rows of this chunk's prompt positions not scored yet (a recompute
        # after preemption does not score them twice); the last prompt position scores no prompt token.
        lp_start = max(start, r.num_prompt_logprobs)
        lp_end = min(start + n_known, r.num_prompt_tokens - 1)
        targets = r.token_ids(lp_start + 1, lp_end + 1) if p.prompt_logprobs is not None and lp_end > lp_start else None
        known = r.token_ids(start, min(start + n_known, r.num_tokens))
        on_device = n_known - len(known)  # sampled by the plan in flight: placeholders
        return ScheduledSeq(
            request_id=r.request_id,
            block_table=tuple(self.kv.block_ids(r.request_id)),
            group_tables=self.kv.group_tables(r.request_id),
            start=start,
            token_ids=known + [0] * on_device,
            draft_token_ids=own,
            model_drafts=model_drafts,
            sample=chunk.completes_sequence,
            params=p,
            prompt_ids=r.prompt_token_ids() if p.repetition_penalty != 1.0 else None,
            output_ids=r.output_token_ids() if needs_out else None,
            prompt_logprobs_start=lp_start,
            prompt_targets=targets,
            guide=r.guide if chunk.completes_sequence else None,
            device_tokens=on_device,
            long_context=r.long_context,
        )

    def update_from_output(
        self, plan: SchedulerOutput, sampled: dict[str, SampledTokens], check_stop: StopCheck
    ) -> list[TokenUpdate]:
        """The step's bookkeeping, in one place: computed tokens advance over what the step fed
        the model, sampled tokens are appended one by one until the first that stops the request,
        accepted drafts count as computed, and newly filled blocks enter the prefix cache."""
        updates = []
        inflight = self._inflight.pop(plan.step, {})
        for seq in plan.seqs:
            chunk = inflight.get(seq.request_id)
            if chunk is None:  # finished (aborted, or stopped a step before) while the step ran
                continue
            request = chunk.request
            request.clear_drafts()
            # The drafts' KV counts only once they are accepted (_append); a rejected draft's slot
            # lies past num_computed_tokens, so nothing reads it before it is overwritten.
            request.num_computed_tokens += chunk.num_new_tokens - chunk.num_draft_tokens
            s = sampled.get(seq.request_id)
            if s is not None and s.prompt_logprobs:
                request.add_prompt_logprobs(s.prompt_logprobs)
            if s is None or not s.token_ids:
                self.kv.cache_full_blocks(request)
                self.kv.free_out_of_window(request)
                continue
            self.spec_stats.record(chunk.num_draft_tokens, len(s.token_ids) - 1)
            updates.append(self._append(request, s, check_stop))
        return updates

    def _append(self, request: Request, sampled: SampledTokens, check_stop: StopCheck) -> TokenUpdate:
        """Append the step's tokens (accepted drafts, then the sampled token), stopping at the
        first that ends the request; later ones are dropped."""
        text, status, n = "", None, 0
        for token_id in sampled.token_ids:
            if n:  # token n-1 was an accepted draft, fed to the model at this step: its KV is valid
                request.num_computed_tokens += 1
            request.append_output(token_id)
            n += 1
            status, piece = check_stop(request, token_id)
            text += piece
            if status is not None:
                break
        self.kv.cache_full_blocks(request)
        self.kv.free_out_of_window(request)
        lps = sampled.logprobs[:n] if sampled.logprobs is not None else None
        return TokenUpdate(request, sampled.token_ids[:n], text, lps, status)

    def _num_drafts(self, request: Request, budget: int) -> int:
        """Drafts to verify with a decoding request this step (0 while it prefills). After the
        step it holds at most num_tokens + 1 + d tokens: within max_tokens and the context."""
        if request.num_tokens - request.num_computed_tokens != 1:
            return 0
        wanted = self.config.model_drafts or request.num_draft_tokens
        room = self.config.max_model_len - request.num_tokens - 1
        limit = self.config.long_context_from
        if limit is not None and not request.long_context:  # drafts stay on the short factors' side
            room = min(room, limit - request.num_tokens)
        if request.params.max_tokens is not None:
            room = min(room, request.params.max_tokens - request.num_output_tokens - 1)
        return max(0, min(wanted, room, budget - 1))

    def _preempt(self, request: Request) -> bool:
        """Take a running request off the batch; True if its KV was sealed and spilled (offload)."""
        self.num_preemptions += 1
        request.clear_drafts()
        if self.kv.can_offload and request.num_computed_tokens > 0:
            try:
                self.kv.swap_out(request)  # KV sealed outside the pool; blocks freed and zeroed
            except KVSpillError:
                # No room to spill it: this request fails (the engine ends it through its single
                # release path); its blocks are freed and zeroed now, so the preemption still frees them.
                self.kv.free(request)
                self._failed.append(request)
                emit("engine.kv_spill_failed", num_requests=1)
                return False
            spilled = True
        else:
            self.kv.free(request)  # recompute: its KV is gone, its tokens are not
            request.num_computed_tokens = 0
            spilled = False
        request.transition(RequestStatus.PREEMPTED)
        self.waiting.appendleft(request)
        return spilled

    def finish(self, request: Request, status: RequestStatus) -> None:
        """The single exit: take the request out of the queues and free (zero) its blocks."""
        for chunks in self._inflight.values():
            chunks.pop(request.request_id, None)
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        request.transition(status)
