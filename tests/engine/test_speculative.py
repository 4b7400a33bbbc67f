"""Speculative decoding, engine side (no torch, no model): prompt lookup, scheduling of drafts,
draft lifetime on the request."""

import pytest

from traceless.config import EngineConfig
from traceless.engine.block_pool import BlockPool
from traceless.engine.kv_manager import KVCacheManager
from traceless.engine.request import Request, RequestStatus
from traceless.engine.scheduler import Scheduler, SchedulerConfig
from traceless.engine.speculative import NgramProposer, SpecStats, SpeculativeConfig, find_ngram
from traceless.modes import SpecMode
from traceless.sampling_params import SamplingParams


# --- prompt lookup --------------------------------------------------------------------------
def test_finds_the_most_recent_earlier_occurrence():
    #        0  1  2  3  4  5  6  7  8  9 10
    tokens = [1, 2, 9, 9, 1, 2, 7, 8, 5, 1, 2]
    assert find_ngram(tokens, 2, 2, 3) == [7, 8, 5]  # [1, 2] at 4 (latest), not at 0


def test_prefers_the_longest_suffix_in_range():
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [3, 1, 2, 6, 0, 1, 2, 4, 3, 1, 2]
    assert find_ngram(tokens, 1, 3, 2) == [6, 0]  # [3, 1, 2] at 0 beats the later [1, 2] at 5
    assert find_ngram(tokens, 1, 2, 2) == [4, 3]  # n capped at 2: the latest [1, 2]
    assert find_ngram(tokens, 3, 3, 1) == [6]


def test_respects_n_min_and_k():
    tokens = [5, 6, 7, 8, 9, 4, 6]
    assert find_ngram(tokens, 1, 3, 2) == [7, 8]  # only the 1-gram [6] occurs earlier
    assert find_ngram(tokens, 2, 3, 2) == []  # n_min = 2: [4, 6] never occurred
    assert find_ngram(tokens, 1, 1, 10) == [7, 8, 9, 4, 6]  # k larger than what follows


def test_no_match_and_short_inputs():
    assert find_ngram([1, 2, 3, 4], 1, 4, 4) == []
    assert find_ngram([1], 1, 4, 4) == []
    assert find_ngram([], 1, 4, 4) == []
    assert find_ngram([7, 7], 1, 4, 4) == [7]  # the match must end before the last token


def test_byte_matches_that_straddle_token_boundaries_are_not_matches():
    # int32 little endian: 0x05000000 0x07000000 0 holds the bytes of [5, 7] at byte offset 3.
    tokens = [5, 7, 9, 0x05000000, 0x07000000, 0, 5, 7]
    assert find_ngram(tokens, 2, 2, 2) == [9, 0x05000000]
    assert find_ngram([0x05000000, 0x07000000, 0, 5, 7], 2, 2, 2) == []


def test_proposer_reads_only_the_request_and_overwrites_its_copy(monkeypatch):
    req = Request("a", [1, 2, 3, 1, 2], SamplingParams(), frozenset())
    seen = []

    def spy(tokens, *args):
        seen.append(tokens)
        return find_ngram(tokens, *args)

    monkeypatch.setattr("traceless.engine.speculative.find_ngram", spy)
    proposer = NgramProposer(SpeculativeConfig(SpecMode.NGRAM, num_tokens=2, ngram_min=2, ngram_max=2))
    assert proposer.propose(req) == [3, 1]
    assert seen == [[0, 0, 0, 0, 0]]  # the token copy was zeroed after the lookup


# --- config ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(speculative="eagle"),
        dict(num_speculative_tokens=0),
        dict(num_speculative_tokens=17),
        dict(ngram_min=0),
        dict(ngram_min=3, ngram_max=2),
        dict(speculative="draft", draft_layers=0),
        dict(speculative="ngram", draft_layers=2),
    ],
)
def test_engine_config_rejects_bad_speculative_options(kwargs):
    with pytest.raises(ValueError):
        EngineConfig(**kwargs)


def test_spec_stats_count_only_steps_with_drafts():
    s = SpecStats()
    s.record(0, 0)
    s.record(4, 3)
    s.record(2, 0)
    assert (s.proposed, s.accepted, s.verify_steps) == (6, 3, 2) and s.acceptance_rate == 0.5


# --- request --------------------------------------------------------------------------------
def test_drafts_are_replaced_cleared_and_wiped():
    req = Request("a", [1, 2, 3], SamplingParams(), frozenset())
    req.set_drafts([4, 5])
    inner = req._drafts
    req.set_drafts([6])
    assert req.draft_token_ids == (6,) and req.num_draft_tokens == 1
    req.clear_drafts()
    assert req.draft_token_ids == ()
    req.set_drafts([7, 8])
    req.wipe()
    assert req.draft_token_ids == () and inner == []
    assert "7" not in repr(req)


# --- scheduling -----------------------------------------------------------------------------
def make(num_blocks=64, block_size=4, **cfg):
    kv = KVCacheManager(BlockPool(num_blocks, lambda ids: None), block_size)
    return Scheduler(SchedulerConfig(**cfg), kv), kv


def decoding(sched, rid, n_prompt, max_tokens=None):
    """A running request that finished its prefill and sampled one token (so it decodes next)."""
    r = Request(rid, list(range(10, 10 + n_prompt)), SamplingParams(max_tokens=max_tokens), frozenset())
    r.transition(RequestStatus.RUNNING)
    sched.running.append(r)
    assert sched.kv.allocate_slots(r, n_prompt)
    r.num_computed_tokens = n_prompt
    r.append_output(7)
    return r


def chunk_of(out, r):
    (s,) = [s for s in out.seqs if s.request_id == r.request_id]
    return s.num_tokens, s.num_drafts, s.sample


def test_a_decoding_request_is_scheduled_for_its_drafts():
    sched, kv = make()
    r = decoding(sched, "a", 5)
    r.set_drafts([1, 2, 3])
    out = sched.schedule()
    assert chunk_of(out, r) == (4, 3, True)
    assert len(kv.block_ids("a")) == 3  # tokens 0..9 (6 known + 3 drafts + room) -> ceil(9 / 4)


@pytest.mark.parametrize(
    "budget,max_tokens,max_len,want",
    [
        (64, None, 100, 3),
        (3, None, 100, 2),
        (1, None, 100, 0),  # token budget
        (64, 3, 100, 1),
        (64, 2, 100, 0),  # max_tokens: 1 output now, at most 3 after the step
        (64, None, 9, 2),
        (64, None, 8, 1),
        (64, None, 7, 0),  # context: 6 tokens now, at most max_len after
    ],
)
def test_drafts_are_capped_by_budget_max_tokens_and_context(budget, max_tokens, max_len, want):
    sched, _ = make(max_num_batched_tokens=budget, max_model_len=max_len)
    r = decoding(sched, "a", 5, max_tokens)
    r.set_drafts([1, 2, 3])
    assert chunk_of(sched.schedule(), r) == (1 + want, want, True)


def test_prefill_chunks_carry_no_drafts_and_model_drafts_reserve_k():
    sched, _ = make(model_drafts=4, max_num_batched_tokens=64)
    a = decoding(sched, "a", 5)
    b = Request("b", list(range(20)), SamplingParams(), frozenset())
    sched.add(b)
    out = sched.schedule()
    assert chunk_of(out, a) == (5, 4, True)  # no drafts on the request: the model makes 4 in the step
    assert chunk_of(out, b) == (20, 0, True)


def test_drafts_never_cost_a_preemption():
    # 4 usable blocks of 4 tokens: a holds 2 (6 tokens), b holds 2 (8 tokens): none free.
    sched, kv = make(num_blocks=5, block_size=4)
    a = decoding(sched, "a", 5)
    b = decoding(sched, "b", 6)  # 7 tokens, 2 blocks
    a.set_drafts([1, 2, 3])  # a's drafts would need a third block
    out = sched.schedule()
    assert chunk_of(out, a) == (1, 0, True) and out.num_preempted == 0
    assert len(kv.block_ids("a")) == 2 and b in sched.running


def test_preemption_clears_drafts():
    sched, _ = make(num_blocks=3, block_size=4)  # 2 usable blocks
    a = decoding(sched, "a", 4)
    b = decoding(sched, "b", 3)
    b.set_drafts([1])
    a.set_drafts([2])
    out = sched.schedule()  # a needs a second block (token 4) -> b (newest) is preempted
    assert out.num_preempted == 1 and b.draft_token_ids == () and list(sched.waiting) == [b]
    assert chunk_of(out, a) == (1, 0, True)
