"""What one engine step hands the model runner, what it gets back, and the interfaces of the parts
the engine is built from. No torch, no engine state: the runner imports this module and nothing
else of the engine.

    Scheduler.schedule() -> SchedulerOutput (plain, frozen) -> ModelExecutor.execute()
        -> {request_id: SampledTokens} -> Scheduler.update_from_output()

The token lists in a SchedulerOutput are copies of user content made for this one step; the engine
calls `wipe()` once the step is over, whatever way it ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from traceless.sampling_params import SamplingParams

if TYPE_CHECKING:
    from traceless.model.tokenizer import Tokenizer
    from traceless.structured.grammar import Guide


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """One request's share of a step.

    Positions [start, start + len(token_ids) + num_drafts) are computed, K/V through block_table
    (KV group 0's; a model with local and global layers has more groups: group_tables holds
    groups 1.., see model/kv_groups.py):

        token_ids    known tokens (a prefill chunk, or the last sampled token when decoding)
        drafts       the request's own drafts (prompt lookup), verified after token_ids; or, when
                     model_drafts > 0, that many positions the runner's draft model fills in the step
        sample       the chunk reaches the end of the known tokens: the step samples after the last
                     known token and after every draft (1 + num_drafts logit rows)
        prompt_targets  (requests asking for prompt logprobs) the prompt tokens that positions
                     [prompt_logprobs_start, prompt_logprobs_start + len(prompt_targets)) predict:
                     the row at position k scores prompt token k + 1
    """

    request_id: str
    block_table: tuple[int, ...]
    start: int
    token_ids: list[int]
    draft_token_ids: list[int]
    model_drafts: int
    sample: bool
    params: SamplingParams
    prompt_ids: list[int] | None = None  # only when a repetition penalty needs them
    output_ids: list[int] | None = None  # only when a penalty needs them
    prompt_logprobs_start: int = 0
    prompt_targets: list[int] | None = None
    guide: Guide | None = None  # structured output, when the step samples: the request's matcher (not a copy)
    # Run ahead: the last device_tokens of token_ids are placeholders (0) for tokens the previous
    # step sampled and the host has not read yet; the runner takes them from the device.
    device_tokens: int = 0
    long_context: bool = False  # LongRoPE: the sequence runs on the long factors (model/rope.py)
    group_tables: tuple[tuple[int, ...], ...] = ()  # the block tables of KV groups 1..

    @property
    def num_drafts(self) -> int:
        return self.model_drafts or len(self.draft_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) + self.num_drafts

    def wipe(self) -> None:
        for buf in (self.token_ids, self.draft_token_ids, self.prompt_ids, self.output_ids, self.prompt_targets):
            if buf is not None:
                buf[:] = [0] * len(buf)
                buf.clear()


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    seqs: tuple[ScheduledSeq, ...]
    num_preempted: int = 0
    step: int = 0  # the scheduler's count: which plan a late result belongs to

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs)

    def wipe(self) -> None:
        for s in self.seqs:
            s.wipe()


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    token_logprob: float
    token_rank: int
    top_ids: list[int]
    top_logprobs: list[float]

    def wipe(self) -> None:
        """Overwrite the top-N lists (the caller drops the object)."""
        for buf in (self.top_ids, self.top_logprobs):
            buf[:] = [0] * len(buf)
            buf.clear()


@dataclass(frozen=True, slots=True)
class SampledTokens:
    """What a step emits for one request: one token, or accepted drafts and one more; and, for
    a request that asks for prompt logprobs, those of the prompt positions it computed (then
    token_ids is empty while the prompt is not complete)."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None  # one per token, when the request asked for logprobs
    prompt_logprobs: list[TokenLogprobs] | None = None  # one per ScheduledSeq.prompt_targets


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the engine and its callers may know of the model it runs."""

    name: str
    path: str
    vocab_size: int
    max_model_len: int
    num_layers: int
    device: str  # "cpu" | "cuda"
    dtype: str  # "float32" | "bfloat16" | "float16"
    attention: str  # "native" | "torch" | "triton"
    load_format: str = "auto"  # "dummy": random weights of a real shape (benchmarks only)
    cuda_graphs: int = 0  # decode batch sizes captured as CUDA graphs (0: eager)
    capture_s: float = 0.0  # seconds spent capturing them at start
    kv_cache_bytes: int = 0  # the KV cache's K and V, all blocks
    kv_cache_dtype: str = "float32"  # what the cache holds (runner/build.py cache_dtype)
    kv_sizing: str = "kv_cache_memory"  # what sized it: runner/kv_budget.py KVSizing's values
    # per KV group (model/kv_groups.py), the keys its layers see behind a query (0: every key): a
    # group with a window frees the blocks behind it as the request runs
    kv_windows: tuple[int, ...] = (0,)
    # LongRoPE: a prompt longer than this runs on the long factors from its first token, so its KV
    # differs from a shorter prompt's over the same tokens (the prefix cache keeps them apart)
    long_context_from: int | None = None
    # "gguf" (a GGUF file's blocks), "q8_0"/"q4_0" (made at load), "fp8" (FP8 matmuls on CUDA) or "none"
    quantization: str = "none"
    # a step whose sequences are all in the paged kernel's batch runs its layers in one native call
    # (model/layers/fused_decode.py)
    fused_forward: bool = False


class PendingResult(Protocol):
    """A launched step's sampled tokens, read (and waited for) when needed."""

    def result(self) -> dict[str, SampledTokens]: ...


class ModelExecutor(Protocol):
    """Runs one step on the model (runner/model_runner.py)."""

    def execute(self, plan: SchedulerOutput) -> dict[str, SampledTokens]:
        """Sampled tokens of every sequence with `sample` set."""

    def release(self, request_id: str) -> None:
        """Drop per-request state (a seeded generator)."""

    def launch(self, plan: SchedulerOutput) -> PendingResult:
        """Start a plain step (runner/run_ahead.py) and return before its tokens are known."""

    def sweep(self) -> None:
        """Zero what the requests released (and the KV blocks freed) since the last sweep left in
        device memory; the engine calls it once per step and after work outside a step."""

    def num_held(self) -> int:
        """Requests whose per-request state is still held."""

    def scrub_workers(self) -> None:
        """Clear what the steps computed on the dead stacks of the threads they ran on (on a CPU,
        the calling thread's OpenMP workers); called from the engine thread when idle."""


class KVMemory(Protocol):
    """The KV cache tensors, by block id (model/layers/kv_cache.py)."""

    num_blocks: int

    def zero_blocks(self, block_ids: list[int]) -> None: ...

    def count_nonzero(self, start: int, end: int) -> int: ...

    def nonzero_blocks(self) -> set[int]: ...


class KVOffloadStore(Protocol):
    """Sealed copies of preempted requests' KV (runner/offload.py)."""

    bytes_out: int  # plaintext bytes sealed so far
    bytes_in: int  # plaintext bytes restored so far

    def save(self, request_id: str, block_ids: list[int]) -> None: ...

    def restore(self, request_id: str, block_ids: list[int]) -> None: ...

    def discard(self, request_id: str) -> None: ...

    def is_swapped(self, request_id: str) -> bool: ...

    def num_swapped(self) -> int: ...


@dataclass(frozen=True, slots=True)
class EngineParts:
    """Everything an LLMEngine is built from; runner/build.py makes one from an EngineConfig."""

    executor: ModelExecutor
    kv_memory: KVMemory
    tokenizer: Tokenizer
    model: ModelInfo
    offload: KVOffloadStore | None = None
