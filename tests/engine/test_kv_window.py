"""Sliding-window block freeing in the KV manager: exact block ids, no torch, no model."""

from tests.support.fake_offload import FakeOffload
from traceless.engine.block_pool import NULL_BLOCK_ID, BlockPool
from traceless.engine.kv_manager import KVCacheManager
from traceless.engine.prefix_cache import PrefixCacheConfig, domain_of
from traceless.engine.request import Request, RequestStatus
from traceless.engine.scheduler import Scheduler, SchedulerConfig
from traceless.engine.step_io import SampledTokens
from traceless.modes import CacheMode
from traceless.sampling_params import SamplingParams

BS, WINDOW = 4, 8


def setup(window=WINDOW, mode=CacheMode.OFF, num_blocks=64, offloader=None):
    zeroed: list[int] = []
    kv = KVCacheManager(BlockPool(num_blocks, zeroed.extend), BS, PrefixCacheConfig(mode), offloader, (window or 0,))
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16), kv)
    return sched, kv, zeroed


def step(sched, token=7):
    """One scheduled step; every sampling sequence gets `token`."""
    out = sched.schedule()
    sampled = {s.request_id: SampledTokens([token], None) for s in out.seqs if s.sample}
    sched.update_from_output(out, sampled, lambda request, token_id: (None, ""))
    return out


def test_a_long_generation_holds_window_sized_memory_and_frees_zeroed_blocks():
    sched, kv, zeroed = setup()
    r = Request("r", list(range(10, 30)), SamplingParams(max_tokens=500), frozenset())
    sched.add(r)
    most = 0
    for _ in range(200):
        out = step(sched)
        most = max(most, kv.num_live_blocks("r"))
        (seq,) = out.seqs
        table = kv.block_ids("r")
        # the table's live part covers every key the next query reads; the rest is the null block
        lo = max(0, r.num_computed_tokens - WINDOW + 1) // BS
        assert all(b == NULL_BLOCK_ID for b in table[:lo]) and NULL_BLOCK_ID not in table[lo:]
        assert kv.check_integrity() == [
            "1 request(s) still own KV blocks",
            "1 request(s) still have sliding-window bookkeeping",
        ]
    assert r.num_computed_tokens > 200
    # a 16-token prefill chunk needs 16 + 8 keys: 7 blocks; decoding needs W/BS + 1 (+1 at an edge)
    assert most <= 7 and kv.num_live_blocks("r") <= WINDOW // BS + 2
    assert len(set(zeroed)) > 40  # freed blocks were zeroed (and reused)
    sched.finish(r, RequestStatus.FINISHED_LENGTH)
    assert kv.check_integrity() == []


def test_no_window_keeps_every_block():
    sched, kv, _ = setup(window=None)
    r = Request("r", list(range(10, 30)), SamplingParams(max_tokens=50), frozenset())
    sched.add(r)
    for _ in range(20):
        step(sched)
    assert NULL_BLOCK_ID not in kv.block_ids("r") and kv.num_live_blocks("r") == -(-r.num_tokens // BS)


def test_a_prefix_hit_references_only_the_blocks_inside_its_window():
    sched, kv, _ = setup(mode=CacheMode.GLOBAL)
    cfg = PrefixCacheConfig(CacheMode.GLOBAL)
    prompt = list(range(100, 140))  # 40 tokens: 10 full blocks
    first = Request("a", prompt, SamplingParams(max_tokens=1), frozenset(), domain=domain_of(cfg, None))
    sched.add(first)
    while first.num_output_tokens == 0:
        step(sched)
    sched.finish(first, RequestStatus.FINISHED_LENGTH)
    second = Request("b", prompt + [5, 6], SamplingParams(max_tokens=1), frozenset(), domain=domain_of(cfg, None))
    sched.add(second)
    out = sched.schedule()
    (seq,) = out.seqs
    assert seq.start == 40  # every full block hit
    table = kv.block_ids("b")
    assert table[:8] == [NULL_BLOCK_ID] * 8  # keys 0..31: below the window of position 40
    assert NULL_BLOCK_ID not in table[8:] and kv.num_live_blocks("b") == 3
    assert sum(1 for b in kv.pool.blocks if b.ref_cnt) == 3


def test_swapping_seals_and_restores_only_the_live_blocks():
    off = FakeOffload()
    sched, kv, _ = setup(offloader=off)
    r = Request("r", list(range(10, 40)), SamplingParams(max_tokens=50), frozenset())
    sched.add(r)
    for _ in range(6):
        step(sched)
    computed = -(-r.num_computed_tokens // BS)
    live = [b for b in kv.block_ids("r")[:computed] if b != NULL_BLOCK_ID]
    kv.swap_out(r)
    assert off.saved["r"] == live and 0 < len(live) <= WINDOW // BS + 1
    n_saved = len(off.saved["r"])
    assert kv.allocate_slots(r, 1)
    kv.swap_in(r)
    assert len(off.restored["r"]) == n_saved and NULL_BLOCK_ID not in off.restored["r"]
    kv.free(r)
    assert kv.check_integrity() == []
