"""Speculative decoding end to end: greedy output identical to plain decoding, sampled output with
the target distribution, stops inside accepted runs, and nothing left behind."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from tests.conftest import ExecutorSpy, llm_with_executor, make_tiny_model
from tests.support.logprobs import assert_same_logprobs
from tests.support.sampling import mixed_params
from traceless import LLM, SamplingParams
from traceless.config import EngineConfig

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


_SPIES: dict[LLM, ExecutorSpy] = {}


def engine(model_dir, mode, **kw):
    """An LLM whose steps `emissions` can watch."""
    opts = dict(dtype="float32", kv_cache_memory=2**21, block_size=4)
    opts.update(kw)
    if mode == "ngram":
        opts.setdefault("ngram_min", 1)
    spies = []
    llm = llm_with_executor(
        EngineConfig(model=str(model_dir), speculative=mode, **opts),
        lambda real: spies.append(ExecutorSpy(real)) or spies[0],
    )
    _SPIES[llm] = spies[0]
    return llm


def prompts(n, seed):
    """Random prompts, half of them with a repeated span (prompt lookup finds something there)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base = [rng.randrange(3, 384) for _ in range(rng.randrange(3, 30))]
        out.append({"prompt_token_ids": base + base[: rng.randrange(1, 12)] if i % 2 else base})
    return out


def token_ids(llm, ps, params=GREEDY):
    return [o.outputs[0].token_ids for o in llm.generate(ps, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def bigram_dir(tmp_path_factory):
    """A tiny Llama without attention output (o_proj = 0): the next token depends on the last one
    only, so prompt lookup over its own samples proposes drafts it often accepts."""
    from safetensors.torch import load_file, save_file

    path = make_tiny_model(tmp_path_factory.mktemp("tiny-bigram"), "llama", seed=3)
    weights = load_file(path / "model.safetensors")
    for name, w in weights.items():
        if name.endswith("o_proj.weight"):
            w.zero_()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


# --- greedy: identical to plain decoding ------------------------------------------------------
@pytest.mark.parametrize("mode", ["ngram", "draft"])
@pytest.mark.parametrize("kind,attention", [("llama", "native"), ("llama", "torch"), ("qwen2", "native")])
def test_greedy_output_is_identical_to_plain_decoding(request, kind, attention, mode):
    model = request.getfixturevalue(f"tiny_{kind}_dir")
    ps = prompts(8, seed=11)
    # a small token budget: prefill chunks of later prompts share steps with earlier decodes
    kw = dict(attention_backend=attention, max_num_batched_tokens=24)
    want = token_ids(engine(model, "off", **kw), ps)
    spec = engine(model, mode, **kw)
    assert token_ids(spec, ps) == want  # batched
    assert [token_ids(spec, [p])[0] for p in ps[:3]] == want[:3]  # one at a time
    stats = spec.engine.spec_stats
    assert stats.proposed > 0 and stats.accepted > 0
    spec.engine.check_integrity()


def test_greedy_with_penalties_and_logprobs_is_identical(tiny_llama_dir):
    ps = prompts(6, seed=4)
    params = SamplingParams(
        temperature=0,
        max_tokens=30,
        ignore_eos=True,
        repetition_penalty=1.05,
        presence_penalty=0.2,
        frequency_penalty=0.1,
        logprobs=2,
    )
    off = engine(tiny_llama_dir, "off").generate(ps, params, use_tqdm=False)
    for mode in ("ngram", "draft"):
        spec = engine(tiny_llama_dir, mode)
        got = spec.generate(ps, params, use_tqdm=False)
        assert spec.engine.spec_stats.accepted > 0
        for a, b in zip(off, got):
            assert b.outputs[0].token_ids == a.outputs[0].token_ids
            for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
                assert_same_logprobs(la, lb)


def emissions(llm, ps, params):
    """Outputs, plus what the runner emitted per step for each request (before stop checks)."""
    seen: dict[str, list[list[int]]] = {}

    def record(plan, out):
        for rid, s in out.items():
            seen.setdefault(rid, []).append(list(s.token_ids))

    spy = _SPIES[llm]
    spy.on_output = record
    try:
        outs = [o.outputs[0] for o in llm.generate(ps, params, use_tqdm=False)]
    finally:
        spy.on_output = None
    return outs, list(seen.values())


def greedy_chain(llm) -> list[int]:
    """The longest run of distinct tokens the bigram model produces greedily from one token."""
    firsts = llm.generate(
        [{"prompt_token_ids": [t]} for t in range(3, 384)],
        SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
        use_tqdm=False,
    )
    nxt = {t: o.outputs[0].token_ids[0] for t, o in zip(range(3, 384), firsts)}
    best: list[int] = []
    for t in nxt:
        chain = [t]
        while nxt.get(chain[-1]) is not None and nxt[chain[-1]] not in chain:
            chain.append(nxt[chain[-1]])
        best = max(best, chain, key=len)
    return best


def test_stops_inside_an_accepted_run_cut_the_output_there(bigram_dir):
    spec, off = engine(bigram_dir, "ngram"), engine(bigram_dir, "off", max_num_seqs=512, max_queued_requests=512)
    chain = greedy_chain(off)
    assert len(chain) >= 10
    # the prompt holds the chain and ends with its first token: after the first output token
    # (chain[1]) prompt lookup proposes chain[2:6], and the greedy model accepts them all
    p = {"prompt_token_ids": chain[:12] + chain[:1]}
    (full,), (steps,) = emissions(spec, [p], GREEDY)
    tokenizer = spec.get_tokenizer()
    # a step (after the first) that emitted >= 3 tokens, whose second token occurs nowhere before:
    # stopping on it cuts that step's accepted run in the middle
    start = len(steps[0])
    for emitted in steps[1:]:
        tok, prev = full.token_ids[start + 1] if len(emitted) >= 3 else None, full.token_ids[: start + 1]
        if tok is not None and tok not in prev and tokenizer.decode([tok]) not in tokenizer.decode(list(prev)):
            break
        start += len(emitted)
    else:
        pytest.fail("no accepted run to stop in")
    word = tokenizer.decode([tok])
    for params in (
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=[tok]),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[word]),
        SamplingParams(temperature=0, max_tokens=start + 2, ignore_eos=True),
    ):
        want = off.generate(p, params, use_tqdm=False)[0].outputs[0]
        (got,), (got_steps,) = emissions(spec, [p], params)
        assert (got.token_ids, got.text, got.finish_reason, got.stop_reason) == (
            want.token_ids,
            want.text,
            want.finish_reason,
            want.stop_reason,
        )
        assert len(got.token_ids) == start + 2
        if params.max_tokens == 40:  # a stop: the last step emitted more than was kept
            assert sum(len(s) for s in got_steps) > len(got.token_ids)
    spec.engine.check_integrity()


def test_max_tokens_and_context_limits_hold_with_drafts(bigram_dir):
    ps = [{"prompt_token_ids": [5, 50, 35, 110, 155, 276, 5, 50, 35]}] * 12
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in range(1, 13)]
    kw = dict(max_model_len=30)
    want = token_ids(engine(bigram_dir, "off", **kw), ps, params)
    spec = engine(bigram_dir, "ngram", **kw)
    assert token_ids(spec, ps, params) == want
    long = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    out = spec.generate(ps[0], long, use_tqdm=False)[0].outputs[0]  # stops at the context: 30 tokens
    assert len(out.token_ids) == 30 - 9 and out.finish_reason == "length"
    plain = engine(bigram_dir, "off", **kw).generate(ps[0], long, use_tqdm=False)[0].outputs[0]
    assert list(out.token_ids) == list(plain.token_ids)
    spec.engine.check_integrity()


# --- sampling: the target distribution ----------------------------------------------------------
def homogeneity_pvalue(a: Counter, b: Counter) -> float:
    """Chi-square test that two samples come from one distribution (cells with < 5 expected merged)."""
    na, nb = sum(a.values()), sum(b.values())
    cells, rest = [], [0, 0]
    for key in set(a) | set(b):
        if (a[key] + b[key]) * min(na, nb) / (na + nb) >= 5:
            cells.append([a[key], b[key]])
        else:
            rest[0] += a[key]
            rest[1] += b[key]
    if sum(rest):
        cells.append(rest)
    obs = torch.tensor(cells, dtype=torch.float64)
    expected = obs.sum(1, keepdim=True) * obs.sum(0, keepdim=True) / obs.sum()
    stat = ((obs - expected) ** 2 / expected).sum()
    dof = torch.tensor((len(cells) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, stat / 2))


@pytest.mark.parametrize("mode,model", [("ngram", "bigram_dir"), ("draft", "tiny_llama_dir")])
def test_sampled_output_keeps_the_target_distribution(request, mode, model):
    """The first 3 tokens across many seeds: speculative vs plain sampling (independent seeds).
    The prompt is the model's own sample, so prompt lookup proposes drafts it often accepts; the
    frequency penalty makes the target at each verified position depend on the drafts before it."""
    path = request.getfixturevalue(model)
    N, kw = (
        2000,
        dict(
            kv_cache_memory=2**23,
            block_size=16,
            max_num_seqs=256,
            max_num_batched_tokens=4096,
            max_queued_requests=4096,
            prefix_cache="global",
        ),
    )
    off = engine(path, "off", **kw)
    sample = SamplingParams(temperature=0.8, top_k=4, max_tokens=60, ignore_eos=True, seed=123)
    own = off.generate({"prompt_token_ids": [5]}, sample, use_tqdm=False)[0].outputs[0]
    prompt = {"prompt_token_ids": [5] + list(own.token_ids)}

    def first3(llm, seeds):
        ps = [
            SamplingParams(temperature=0.8, top_k=4, frequency_penalty=1.0, max_tokens=4, ignore_eos=True, seed=s)
            for s in seeds
        ]
        return Counter(tuple(o.outputs[0].token_ids[:3]) for o in llm.generate([prompt] * N, ps, use_tqdm=False))

    spec = engine(path, mode, **kw)
    got = first3(spec, range(N, 2 * N))
    stats = spec.engine.spec_stats
    assert stats.accepted > 0.05 * N and stats.proposed - stats.accepted > 0.05 * N  # both paths ran
    assert homogeneity_pvalue(first3(off, range(N)), got) > 1e-3
    spec.engine.drop_prefix_cache()
    spec.engine.check_integrity()


def test_seeded_sampling_with_drafts_is_reproducible(tiny_llama_dir):
    p = {"prompt_token_ids": [11, 12, 13, 14, 15, 11, 12, 13]}
    sp = SamplingParams(temperature=1.0, top_p=0.95, seed=42, max_tokens=24, ignore_eos=True)
    for mode in ("ngram", "draft"):
        llm = engine(tiny_llama_dir, mode)
        alone = token_ids(llm, [p], sp)[0]
        busy = prompts(6, seed=5) + [p]
        noise = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
        assert token_ids(llm, busy, [noise] * 6 + [sp])[6] == alone
        assert (
            token_ids(llm, [p], SamplingParams(temperature=1.0, top_p=0.95, seed=43, max_tokens=24, ignore_eos=True))[0]
            != alone
        )
        llm.engine.check_integrity()


# --- integrity ----------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_mixed_workload_with_preemption_and_aborts_leaves_nothing(tiny_llama_dir, mode):
    # 40 usable blocks of 4 tokens: small enough to force preemption (see test_llm.py)
    llm = engine(
        tiny_llama_dir,
        mode,
        kv_cache_memory=41 * 2048,
        max_num_batched_tokens=64,
        max_model_len=128,
        prefix_cache="global",
    )
    eng = llm.engine
    rng = random.Random(1)
    params = mixed_params()  # the plain engine's mixed workload (test_llm.py)
    for i, p in enumerate(prompts(24, seed=2)):
        eng.add_request(f"r{i}", p["prompt_token_ids"], params[i % len(params)])
    finished, aborted, steps = set(), set(), 0
    while eng.has_unfinished():
        for out in eng.step():
            assert len(out.new_token_ids) >= 1 or out.finished
            if out.finished:
                finished.add(out.request_id)
        steps += 1
        if steps % 7 == 0:
            live = sorted({f"r{i}" for i in range(24)} - finished - aborted)
            if live:
                victim = rng.choice(live)
                assert eng.abort(victim)
                aborted.add(victim)
    assert eng.kv_stats().preemptions > 0 and eng.spec_stats.accepted > 0
    assert finished | aborted == {f"r{i}" for i in range(24)}
    eng.drop_prefix_cache()
    eng.check_integrity()


def test_draft_layers_must_leave_a_layer_to_verify_with(tiny_llama_dir):
    with pytest.raises(ValueError, match="draft_layers"):
        engine(tiny_llama_dir, "draft", draft_layers=2)  # the tiny model has 2 layers
    llm = engine(tiny_llama_dir, "draft", draft_layers=1)
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == GREEDY.max_tokens and llm.engine.spec_stats.proposed > 0


# --- the real default model ---------------------------------------------------------------------
DEFAULT_PROMPTS = [
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\ndef fib2(n):\n",
    "Once upon a time",
]
DEFAULT_GREEDY = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)


@pytest.fixture(scope="module")
def default_plain(real_llm) -> list:
    """The default model's greedy answers without speculation (the same for both modes)."""
    return [o.outputs[0].token_ids for o in real_llm.generate(DEFAULT_PROMPTS, DEFAULT_GREEDY, use_tqdm=False)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_default_model_greedy_is_identical(default_plain, mode):
    spec = LLM(dtype="float32", kv_cache_memory=512 * 2**20, speculative=mode)
    got = spec.generate(DEFAULT_PROMPTS, DEFAULT_GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == default_plain
    assert spec.engine.spec_stats.accepted > 0
    spec.engine.check_integrity()
