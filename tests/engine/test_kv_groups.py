"""KV groups in the KV manager (local and global layers, Gemma-shaped): exact block ids, no torch.

Groups (0, W, W): one global group that keeps every block and two local groups that free the
blocks behind their window."""

from tests.support.fake_offload import FakeOffload
from traceless.engine.block_pool import NULL_BLOCK_ID, BlockPool
from traceless.engine.kv_manager import KVCacheManager
from traceless.engine.prefix_cache import CacheMode, PrefixCacheConfig, domain_of
from traceless.engine.request import Request, RequestStatus
from traceless.engine.scheduler import Scheduler, SchedulerConfig
from traceless.engine.step_io import SampledTokens
from traceless.sampling_params import SamplingParams

BS, WINDOW = 4, 8
GROUPS = (0, WINDOW, WINDOW)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def setup(mode=CacheMode.OFF, num_blocks=128, offloader=None):
    zeroed: list[int] = []
    clock = Clock()
    kv = KVCacheManager(
        BlockPool(num_blocks, zeroed.extend, clock), BS, PrefixCacheConfig(mode, ttl_s=50.0), offloader, GROUPS
    )
    return Scheduler(SchedulerConfig(max_num_batched_tokens=16), kv), kv, zeroed, clock


def step(sched, token=7):
    out = sched.schedule()
    sampled = {s.request_id: SampledTokens([token], None) for s in out.seqs if s.sample}
    sched.update_from_output(out, sampled, lambda request, token_id: (None, ""))
    return out


def test_local_groups_stay_window_sized_while_the_global_group_grows():
    sched, kv, zeroed, _ = setup()
    r = Request("r", list(range(10, 30)), SamplingParams(max_tokens=300), frozenset())
    sched.add(r)
    most_local = 0
    for _ in range(200):
        (seq,) = step(sched).seqs
        assert len(seq.group_tables) == 2 and seq.block_table == tuple(kv.block_ids("r"))
        most_local = max(most_local, kv.num_live_blocks("r", 1), kv.num_live_blocks("r", 2))
        # the global table has every block; a local one the null block below the next query's window
        lo = max(0, r.num_computed_tokens - WINDOW + 1) // BS
        for g in (1, 2):
            table = kv.block_ids("r", g)
            assert table[:lo] == [NULL_BLOCK_ID] * lo and NULL_BLOCK_ID not in table[lo:]
        assert NULL_BLOCK_ID not in kv.block_ids("r", 0)
    assert r.num_computed_tokens > 200
    assert kv.num_live_blocks("r", 0) == -(-r.num_computed_tokens // BS) + (r.num_computed_tokens % BS == 0)
    # a 16-token chunk needs 16 + 8 keys: 7 blocks; decoding W / BS + 1 (+1 at an edge)
    assert most_local <= 7 and kv.num_live_blocks("r", 1) <= WINDOW // BS + 2
    # every group's blocks are distinct: no block is shared by two groups
    ids = [b for g in range(3) for b in kv.block_ids("r", g) if b != NULL_BLOCK_ID]
    assert len(ids) == len(set(ids))
    assert len(zeroed) > 90  # the local groups' freed blocks were zeroed (and reused)
    sched.finish(r, RequestStatus.FINISHED_LENGTH)
    assert kv.check_integrity() == []


def _run_to_first_token(sched, rid, tokens, cfg):
    r = Request(rid, tokens, SamplingParams(max_tokens=1), frozenset(), domain=domain_of(cfg, None))
    sched.add(r)
    while r.num_output_tokens == 0:
        step(sched)
    return r


def test_a_prefix_hit_takes_the_local_blocks_its_window_reads_and_no_evicted_one():
    sched, kv, zeroed, clock = setup(mode=CacheMode.GLOBAL)
    cfg = PrefixCacheConfig(CacheMode.GLOBAL)
    prompt = list(range(100, 140))  # 40 tokens: 10 full blocks, prefilled in chunks of 16
    first = _run_to_first_token(sched, "a", prompt, cfg)
    local_a = kv.block_ids("a", 1)[8:10]  # the local blocks alive at the end: keys 32..39
    clock.t = 100.0
    sched.finish(first, RequestStatus.FINISHED_LENGTH)
    # The local blocks that left the window while "a" ran were released at t=0: expire them (evicted,
    # zeroed); the global blocks and the local blocks released at the finish stay cached.
    evicted = kv.pool.expire(50.0, now=120.0)
    assert evicted == 16 and len(kv.pool.cached) == 3 * 10 - 16
    # the same 40 tokens and more: every full block hits, the local groups take only keys 32..39
    second = Request("b", prompt + [5, 6], SamplingParams(max_tokens=1), frozenset(), domain=domain_of(cfg, None))
    sched.add(second)
    (seq,) = sched.schedule().seqs
    assert seq.start == 40
    assert kv.block_ids("b", 1)[:8] == [NULL_BLOCK_ID] * 8 and kv.block_ids("b", 1)[8:10] == local_a
    assert NULL_BLOCK_ID not in kv.block_ids("b", 0)
    sched.finish(second, RequestStatus.FINISHED_ABORTED)
    # 24 shared tokens: the global group has them, but the local blocks of keys 17..23 were evicted,
    # so no hit (a shorter one would need local blocks that are gone too)
    third = Request(
        "c", prompt[:24] + [1, 2, 3], SamplingParams(max_tokens=1), frozenset(), domain=domain_of(cfg, None)
    )
    assert kv.prefix_hit(third) is None
    kv.pool.drop_cache()
    assert kv.check_integrity() == []


def test_a_hit_shorter_than_the_window_needs_every_group():
    sched, kv, _, _ = setup(mode=CacheMode.GLOBAL)
    cfg = PrefixCacheConfig(CacheMode.GLOBAL)
    prompt = list(range(200, 212))  # 12 tokens: 3 full blocks, inside the window's reach
    sched.finish(_run_to_first_token(sched, "a", prompt, cfg), RequestStatus.FINISHED_LENGTH)
    probe = Request("p", prompt + [9], SamplingParams(max_tokens=1), frozenset(), domain=domain_of(cfg, None))
    hit = kv.prefix_hit(probe)
    assert hit is not None and hit.num_blocks == 3
    # the window at position 12 reads keys 5..12: local blocks 1 and 2 taken, block 0 not
    assert [b is None for b in hit.blocks[1]] == [True, False, False] and None not in hit.blocks[0]
    kv.pool.drop_cache()


def test_swapping_seals_and_restores_every_groups_live_blocks():
    off = FakeOffload()
    sched, kv, _, _ = setup(offloader=off)
    r = Request("r", list(range(10, 40)), SamplingParams(max_tokens=50), frozenset())
    sched.add(r)
    for _ in range(6):
        step(sched)
    n = -(-r.num_computed_tokens // BS)
    live = [b for g in range(3) for b in kv.block_ids("r", g)[:n] if b != NULL_BLOCK_ID]
    kv.swap_out(r)
    assert off.saved["r"] == live and len(live) == n + 2 * (n - (r.num_computed_tokens - WINDOW + 1) // BS)
    assert kv.allocate_slots(r, 1)
    kv.swap_in(r)
    assert len(off.restored["r"]) == len(live) and NULL_BLOCK_ID not in off.restored["r"]
    kv.free(r)
    assert kv.check_integrity() == []


def test_allocation_takes_every_groups_blocks_or_none():
    sched, kv, _, _ = setup(num_blocks=10)  # 9 usable blocks
    r = Request("r", list(range(10, 23)), SamplingParams(max_tokens=5), frozenset())
    assert not kv.allocate_slots(r, 13)  # 4 blocks in each of 3 groups: 12 > 9, so none is taken
    assert kv.pool.num_free_blocks == 9 and kv.num_owners() == 0
    r2 = Request("s", list(range(10, 21)), SamplingParams(max_tokens=5), frozenset())
    assert kv.allocate_slots(r2, 11) and kv.pool.num_free_blocks == 0
    assert kv.check_integrity() == [
        "1 request(s) still own KV blocks",
        "1 request(s) still have sliding-window bookkeeping",
    ]
    kv.free(r2)
    assert kv.num_owners() == 0 and kv.check_integrity() == []
