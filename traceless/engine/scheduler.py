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
from dataclasses import dataclass

from traceless.engine.kv_manager import KVCacheManager
from traceless.engine.request import Request, RequestStatus
from traceless.events import emit


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    model_drafts: int = 0  # draft positions per decoding request for drafts the model makes in the step

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 2:
            raise ValueError("max_num_seqs, max_num_batched_tokens must be >= 1 and max_model_len >= 2")
        if self.model_drafts < 0:
            raise ValueError("model_drafts must be >= 0")


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """num_new_tokens from the request's num_computed_tokens on; the last num_draft_tokens of them
    are drafts (the request's own, or made by the model in the step) that the step verifies."""

    request: Request
    num_new_tokens: int
    num_draft_tokens: int = 0

    @property
    def completes_sequence(self) -> bool:
        """After this chunk every known token is computed, so the step samples a new one."""
        r = self.request
        return r.num_computed_tokens + self.num_new_tokens - self.num_draft_tokens == r.num_tokens


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    chunks: tuple[ScheduledChunk, ...]
    num_preempted: int

    @property
    def num_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted = 0

        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            d = self._num_drafts(request, budget)
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            if d and self.kv.allocate_slots(request, n + d):
                chunks.append(ScheduledChunk(request, n + d, d))
                budget -= n + d
                i += 1
                continue
            while not self.kv.allocate_slots(request, n):
                victim = self.running.pop()  # always at index >= i: not yet scheduled this step
                self._preempt(victim)
                preempted += 1
                if victim is request:
                    break
            else:
                chunks.append(ScheduledChunk(request, n))
                budget -= n
                i += 1
                continue
            break

        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs and not preempted:
            request = self.waiting[0]
            swapped = self.kv.is_swapped(request)
            # A request starting from scratch (new, or preempted by recompute) first takes the
            # cached blocks of its own domain that hold its leading tokens; a swapped-out one gets
            # its own KV back instead.
            computed = self.kv.computed_blocks(request) if request.num_computed_tokens == 0 and not swapped else []
            cached = len(computed) * self.kv.block_size
            n = min(request.num_tokens - request.num_computed_tokens - cached, budget)
            if not self.kv.allocate_slots(request, n, computed):
                break
            if swapped:
                self.kv.swap_in(request)
            request.num_computed_tokens += cached
            self.waiting.popleft()
            request.transition(RequestStatus.RUNNING)
            self.running.append(request)
            chunks.append(ScheduledChunk(request, n))
            budget -= n

        if preempted:
            emit("engine.preempted", num_requests=preempted)
        return SchedulerOutput(tuple(chunks), preempted)

    def _num_drafts(self, request: Request, budget: int) -> int:
        """Drafts to verify with a decoding request this step (0 while it prefills). After the
        step it holds at most num_tokens + 1 + d tokens: within max_tokens and the context."""
        if request.num_tokens - request.num_computed_tokens != 1:
            return 0
        wanted = self.config.model_drafts or request.num_draft_tokens
        room = self.config.max_model_len - request.num_tokens - 1
        if request.params.max_tokens is not None:
            room = min(room, request.params.max_tokens - request.num_output_tokens - 1)
        return max(0, min(wanted, room, budget - 1))

    def _preempt(self, request: Request) -> None:
        request.clear_drafts()
        if self.kv.can_offload and request.num_computed_tokens > 0:
            self.kv.swap_out(request)  # KV sealed outside the pool; blocks freed and zeroed
        else:
            self.kv.free(request)  # recompute: its KV is gone, its tokens are not
            request.num_computed_tokens = 0
        request.transition(RequestStatus.PREEMPTED)
        self.waiting.appendleft(request)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """The single exit: take the request out of the queues and free (zero) its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        request.transition(status)
