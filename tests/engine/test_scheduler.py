"""Scheduler decisions with exact block ids (no torch, no model)."""

from traceless.engine.block_pool import BlockPool
from traceless.engine.kv_manager import KVCacheManager
from traceless.engine.request import Request, RequestStatus
from traceless.engine.scheduler import Scheduler, SchedulerConfig
from traceless.engine.step_io import SampledTokens
from traceless.sampling_params import SamplingParams


def make(num_blocks=64, block_size=4, **cfg):
    zeroed = []
    kv = KVCacheManager(BlockPool(num_blocks, zeroed.extend), block_size)
    return Scheduler(SchedulerConfig(**cfg), kv), kv, zeroed


def req(rid, n_prompt):
    return Request(rid, list(range(10, 10 + n_prompt)), SamplingParams(), frozenset())


def never_stop(request, token_id):
    return None, ""


def run_step(sched):
    """A step as the engine runs it: every sequence that samples gets token 7."""
    out = sched.schedule()
    sched.update_from_output(out, {s.request_id: SampledTokens([7], None) for s in out.seqs if s.sample}, never_stop)
    return out


def test_chunked_prefill_under_the_token_budget_mixes_with_decodes():
    sched, kv, _ = make(max_num_batched_tokens=8)
    a, b = req("a", 3), req("b", 11)
    sched.add(a)
    sched.add(b)
    out = run_step(sched)
    assert [(s.request_id, s.num_tokens) for s in out.seqs] == [("a", 3), ("b", 5)]
    out = run_step(sched)  # a decodes one token, b continues its prefill
    assert [(s.request_id, s.num_tokens) for s in out.seqs] == [("a", 1), ("b", 6)]
    assert b.num_output_tokens == 1 and a.num_output_tokens == 2
    assert kv.block_ids("a") == [1] and kv.block_ids("b") == [2, 3, 4]


def test_max_num_seqs_limits_the_running_set_fifo():
    sched, _, _ = make(max_num_seqs=2)
    for r in "abc":
        sched.add(req(r, 2))
    out = run_step(sched)
    assert [s.request_id for s in out.seqs] == ["a", "b"]
    assert [r.request_id for r in sched.waiting] == ["c"]


def test_preemption_takes_the_newest_request_and_zeroes_its_blocks():
    # 5 usable blocks of 4 tokens; two requests of 8 tokens each fill 4 blocks
    sched, kv, zeroed = make(num_blocks=6, block_size=4)
    a, b = req("a", 8), req("b", 8)
    sched.add(a)
    sched.add(b)
    run_step(sched)  # a: 2 blocks, b: 2 blocks, 1 block free
    assert kv.block_ids("a") == [1, 2] and kv.block_ids("b") == [3, 4]
    run_step(sched)  # both decode token 9: a takes block 5, b must preempt itself (newest)
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert sorted(zeroed) == [3, 4]
    assert kv.block_ids("b") == [] and kv.block_ids("a") == [1, 2, 5]
    assert list(sched.waiting) == [b] and b.num_output_tokens == 1  # generated tokens are kept
    sched.finish(a, RequestStatus.FINISHED_STOPPED)
    out = run_step(sched)  # b comes back and recomputes prompt + its output token
    assert [(s.request_id, s.num_tokens) for s in out.seqs] == [("b", 9)]
    assert b.status is RequestStatus.RUNNING


def test_running_request_preempts_a_later_one_not_itself():
    sched, kv, _ = make(num_blocks=4, block_size=4)  # 3 usable blocks
    a, b = req("a", 4), req("b", 4)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    assert kv.block_ids("a") == [1] and kv.block_ids("b") == [2]
    # a needs a second block at token 5; one is free, b also needs one -> b is preempted
    out = run_step(sched)
    assert [s.request_id for s in out.seqs] == ["a"]
    assert b.status is RequestStatus.PREEMPTED and out.num_preempted == 1


def test_finish_frees_every_block_and_leaves_the_queues_empty():
    sched, kv, zeroed = make()
    a = req("a", 9)
    sched.add(a)
    run_step(sched)
    sched.finish(a, RequestStatus.FINISHED_ABORTED)
    assert sorted(zeroed) == [1, 2, 3]
    assert sched.num_unfinished == 0 and kv.check_integrity() == []


def test_waiting_request_can_be_finished_before_it_runs():
    sched, kv, zeroed = make()
    a = req("a", 5)
    sched.add(a)
    sched.finish(a, RequestStatus.FINISHED_ABORTED)
    assert a.status is RequestStatus.FINISHED_ABORTED and zeroed == [] and sched.num_unfinished == 0
