"""Prefix caching with isolation domains: exact block ids, no torch, no model."""

import pytest

from traceless.engine.block_pool import BlockPool
from traceless.engine.kv_manager import KVCacheManager
from traceless.engine.prefix_cache import PrefixCacheConfig, block_hashes, domain_of, hash_block
from traceless.engine.request import Request, RequestStatus
from traceless.engine.scheduler import Scheduler, SchedulerConfig
from traceless.errors import InvalidRequestError
from traceless.modes import CacheMode
from traceless.sampling_params import SamplingParams

BS = 4
SALT_A = "a" * 22
SALT_B = "b" * 22


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def setup(mode=CacheMode.ISOLATED, public=(), num_blocks=32):
    zeroed, clock = [], Clock()
    cfg = PrefixCacheConfig(mode, ttl_s=10.0, public_prefixes=public)
    kv = KVCacheManager(BlockPool(num_blocks, zeroed.extend, clock), BS, cfg)
    return Scheduler(SchedulerConfig(), kv), kv, zeroed, clock, cfg


def run(sched, kv, rid, tokens, cfg, salt=None):
    """Admit a request, run its prefill, finish it; returns how many tokens came from the cache."""
    r = Request(rid, tokens, SamplingParams(), frozenset(), domain=domain_of(cfg, salt))
    sched.add(r)
    out = sched.schedule()
    (seq,) = out.seqs
    cached = seq.start
    sched.update_from_output(out, {}, lambda request, token_id: (None, ""))
    sched.finish(r, RequestStatus.FINISHED_STOPPED)
    return cached


PROMPT = list(range(100, 114))  # 14 tokens: 3 full blocks + 2


def test_hits_only_within_the_same_salt():
    sched, kv, zeroed, _, cfg = setup()
    assert run(sched, kv, "a1", PROMPT, cfg, SALT_A) == 0
    assert len(kv.pool.cached) == 3 and zeroed == [4]  # the partial last block is zeroed, full ones stay cached
    assert run(sched, kv, "a2", PROMPT + [7, 8], cfg, SALT_A) == 12
    assert run(sched, kv, "b1", PROMPT, cfg, SALT_B) == 0  # another user's salt: nothing
    assert run(sched, kv, "n1", PROMPT, cfg, None) == 0  # no salt: nothing, and nothing cached
    assert kv.check_integrity() == [f"{len(kv.pool.cached)} block(s) still in the prefix cache"]


def test_at_least_one_token_is_computed():
    sched, kv, _, _, cfg = setup()
    run(sched, kv, "a1", PROMPT[:12], cfg, SALT_A)
    assert run(sched, kv, "a2", PROMPT[:12], cfg, SALT_A) == 8  # 3 blocks cached, the last is recomputed


def test_public_prefixes_are_shared_across_domains_and_the_rest_is_not():
    public = (tuple(PROMPT[:9]),)  # 2 full public blocks (the 9th token is in a private block)
    sched, kv, _, _, cfg = setup(public=public)
    run(sched, kv, "a1", PROMPT, cfg, SALT_A)
    assert run(sched, kv, "b1", PROMPT, cfg, SALT_B) == 8  # only the public blocks
    assert run(sched, kv, "n1", PROMPT, cfg, None) == 8  # unsalted requests may use public blocks
    assert run(sched, kv, "a2", PROMPT, cfg, SALT_A) == 12  # its own domain continues after them


def test_global_mode_shares_everything_and_off_nothing():
    sched, kv, _, _, cfg = setup(CacheMode.GLOBAL)
    run(sched, kv, "x", PROMPT, cfg, None)
    assert run(sched, kv, "y", PROMPT, cfg, SALT_B) == 12
    sched, kv, _, _, cfg = setup(CacheMode.OFF)
    run(sched, kv, "x", PROMPT, cfg, SALT_A)
    assert run(sched, kv, "y", PROMPT, cfg, SALT_A) == 0 and not kv.pool.cached


def test_hash_chain_depends_on_parent_tokens_and_domain():
    a, b = domain_of(PrefixCacheConfig(), SALT_A), domain_of(PrefixCacheConfig(), SALT_B)
    assert a != b and hash_block(b"\0" * 32, [1, 2], a) != hash_block(b"\0" * 32, [1, 2], b)
    h1 = block_hashes(PrefixCacheConfig(), [1, 2, 3, 4, 5, 6, 7, 8], a, BS)
    h2 = block_hashes(PrefixCacheConfig(), [9, 2, 3, 4, 5, 6, 7, 8], a, BS)
    assert h1[1][1] == h2[1][1] and h1[1][0] != h2[1][0]  # same block tokens, different parent


def test_a_hash_match_with_different_tokens_is_not_a_hit():
    sched, kv, _, _, cfg = setup()
    run(sched, kv, "a1", PROMPT, cfg, SALT_A)
    block = next(iter(kv.pool.cached.values()))
    block.tokens = (0, 0, 0, 0)  # as if a hash collision had mapped other tokens here
    assert run(sched, kv, "a2", PROMPT, cfg, SALT_A) == 0


def test_ttl_expiry_and_eviction_zero_cached_blocks():
    sched, kv, zeroed, clock, cfg = setup(num_blocks=5)  # 4 usable blocks
    run(sched, kv, "a1", PROMPT[:12], cfg, SALT_A)
    cached_ids = sorted(b.block_id for b in kv.pool.cached.values())
    zeroed.clear()
    # eviction for space: a 16-token request needs all 4 blocks
    run(sched, kv, "b1", list(range(500, 516)), cfg, SALT_B)
    assert sorted(zeroed)[:3] == cached_ids  # evicted cached blocks were zeroed before reuse
    zeroed.clear()
    clock.t = 5.0
    assert kv.pool.expire(10.0) == 0 and zeroed == []
    clock.t = 30.0
    assert kv.pool.expire(10.0) == 4 and len(zeroed) == 4  # b1 filled all 4 blocks
    assert kv.check_integrity() == []


@pytest.mark.parametrize("salt", ["short", "x" * 21, "not base64!!" * 3, 12345, "a" * 300])
def test_weak_or_malformed_salts_are_refused(salt):
    with pytest.raises(InvalidRequestError, match="cache_salt"):
        domain_of(PrefixCacheConfig(), salt)
