"""The offline API end to end on tiny random models (fast) and the real default model (slow)."""

from __future__ import annotations

import random

import pytest

from tests.conftest import ExecutorSpy, llm_with_executor
from tests.support.sampling import mixed_params
from traceless import LLM, SamplingParams
from traceless.config import EngineConfig
from traceless.errors import ContextLengthError, InvalidRequestError, ModelLoadError, ModelNotFoundError


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    # A block holds K and V for 4 tokens x 2 layers x 2 kv heads x 16 dims in float32 = 2048 bytes;
    # 41 blocks (40 usable) = 160 tokens of KV: small enough to force preemption.
    return LLM(
        str(tiny_llama_dir),
        dtype="float32",
        block_size=4,
        kv_cache_memory=41 * 2048,
        max_num_batched_tokens=64,
        max_model_len=128,
    )


def prompts(n, lo=3, hi=40, seed=0):
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(3, 384) for _ in range(rng.randrange(lo, hi))]} for _ in range(n)]


def test_mixed_workload_with_preemption_aborts_and_stops_leaves_nothing(tiny):
    engine = tiny.engine
    rng = random.Random(1)
    params = mixed_params()
    for i, p in enumerate(prompts(24, seed=2)):
        engine.add_request(f"r{i}", p["prompt_token_ids"], params[i % len(params)])
    finished, aborted, steps = set(), set(), 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished.add(out.request_id)
        steps += 1
        if steps % 7 == 0:  # abort something mid-flight now and then
            live = sorted({f"r{i}" for i in range(24)} - finished - aborted)
            if live:
                victim = rng.choice(live)
                assert engine.abort(victim)
                aborted.add(victim)
    assert engine.kv_stats().preemptions > 0, "the workload was meant to run out of KV blocks"
    assert finished | aborted == {f"r{i}" for i in range(24)}
    engine.check_integrity()


def test_abort_of_a_waiting_and_unknown_request(tiny):
    engine = tiny.engine
    engine.add_request("w", [5, 6, 7], SamplingParams(max_tokens=3))
    assert engine.abort("w") and not engine.abort("w") and not engine.abort("nope")
    engine.check_integrity()


def test_step_failure_fails_the_batch_and_the_engine_keeps_serving(tiny_llama_dir):
    spies = []
    llm = llm_with_executor(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20),
        lambda real: spies.append(ExecutorSpy(real)) or spies[0],
    )
    engine = llm.engine
    engine.add_request("doomed", [5, 6, 7, 8], SamplingParams(max_tokens=5))
    spies[0].broken = True
    outs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [("doomed", "error")]
    engine.check_integrity()
    spies[0].broken = False
    out = llm.generate({"prompt_token_ids": [5, 6, 7, 8]}, SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 5
    engine.check_integrity()


def test_seeded_sampling_is_the_same_alone_and_in_a_busy_batch(tiny):
    p = {"prompt_token_ids": [11, 12, 13, 14, 15]}
    sp = SamplingParams(temperature=1.0, top_p=0.95, seed=42, max_tokens=24, ignore_eos=True)
    alone = tiny.generate(p, sp, use_tqdm=False)[0].outputs[0].token_ids
    busy = prompts(12, seed=5)
    mixed = busy[:6] + [p] + busy[6:]
    noise = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
    outs = tiny.generate(mixed, [noise] * 6 + [sp] + [noise] * 6, use_tqdm=False)
    assert outs[6].outputs[0].token_ids == alone
    other = SamplingParams(temperature=1.0, top_p=0.95, seed=43, max_tokens=24, ignore_eos=True)
    assert tiny.generate(p, other, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_n_completions_logprobs_and_stop_reasons(tiny):
    out = tiny.generate(
        {"prompt_token_ids": [20, 21, 22]},
        SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, logprobs=2, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert [c.index for c in out.outputs] == [0, 1, 2] and out.finished
    for c in out.outputs:
        assert len(c.token_ids) == 6 and c.finish_reason == "length" and len(c.logprobs) == 6
        for tok, lp in zip(c.token_ids, c.logprobs):
            assert tok in lp and len(lp) in (2, 3)  # top-2 plus the sampled token when it is not among them
    assert len({c.token_ids for c in out.outputs}) > 1
    greedy = tiny.generate(
        {"prompt_token_ids": [20, 21, 22]}, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    stop_tok = greedy.token_ids[3]
    stopped = tiny.generate(
        {"prompt_token_ids": [20, 21, 22]},
        SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop_tok], ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    first = greedy.token_ids.index(stop_tok)
    assert stopped.token_ids == greedy.token_ids[: first + 1] and stopped.stop_reason == stop_tok
    words = greedy.text.split()
    stop_str = " ".join(words[2:4])
    by_string = tiny.generate(
        {"prompt_token_ids": [20, 21, 22]},
        SamplingParams(temperature=0, max_tokens=8, stop=[stop_str], ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert by_string.text == greedy.text[: greedy.text.index(stop_str)]
    assert by_string.finish_reason == "stop" and by_string.stop_reason == stop_str
    tiny.engine.check_integrity()


def test_bad_input_raises_typed_errors_and_the_engine_keeps_serving(tiny, tmp_path):
    with pytest.raises(InvalidRequestError, match="empty"):
        tiny.generate({"prompt_token_ids": []}, use_tqdm=False)
    with pytest.raises(ContextLengthError):
        tiny.generate({"prompt_token_ids": [5] * 200}, use_tqdm=False)
    with pytest.raises(InvalidRequestError, match="prompt_token_ids"):
        tiny.generate({"prompt_token_ids": [5, 10**6]}, use_tqdm=False)
    with pytest.raises(InvalidRequestError):
        tiny.generate({"prompt": 5}, use_tqdm=False)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=-1)
    # a batch whose last prompt is bad adds nothing
    with pytest.raises(ContextLengthError):
        tiny.generate([{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [5] * 500}], use_tqdm=False)
    tiny.engine.check_integrity()
    with pytest.raises(ModelNotFoundError):
        LLM(str(tmp_path / "missing"))
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(ModelLoadError):
        LLM(str(corrupt))
    ok = tiny.generate({"prompt_token_ids": [5, 6]}, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(ok[0].outputs[0].token_ids) == 3
    tiny.engine.check_integrity()


def test_chat_applies_the_template(tiny):
    out = tiny.chat(
        [{"role": "user", "content": "w5 w6"}], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False
    )[0]
    tok = tiny.get_tokenizer()
    assert list(out.prompt_token_ids) == tok.encode("<s> user w5 w6 </s> <s> assistant ", add_special_tokens=False)
    with pytest.raises(InvalidRequestError):
        tiny.chat([{"role": "user"}], use_tqdm=False)


@pytest.mark.slow
def test_default_model_chat_and_seeded_batch(real_llm):
    out = real_llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=20),
        use_tqdm=False,
    )[0].outputs[0]
    assert "Paris" in out.text and out.finish_reason == "stop"
    sp = SamplingParams(temperature=0.9, seed=2024, max_tokens=32, ignore_eos=True)
    alone = real_llm.generate("Once upon a time", sp, use_tqdm=False)[0].outputs[0].token_ids
    crowd = ["Tell me about the ocean.", "The weather today", "import numpy as np", "Dear diary,"]
    outs = real_llm.generate(
        crowd[:2] + ["Once upon a time"] + crowd[2:],
        [SamplingParams(temperature=1.0, max_tokens=32)] * 2
        + [sp]
        + [SamplingParams(temperature=1.0, max_tokens=32)] * 2,
        use_tqdm=False,
    )
    assert outs[2].outputs[0].token_ids == alone
    real_llm.engine.check_integrity()


@pytest.mark.parametrize("request_events", [False, True])
def test_per_request_events_only_with_the_benchmark_switch(tiny_llama_dir, caplog, request_events):
    """request.finished (exact token counts and timings of one request) is logged only with
    request_events, a benchmark's switch; by default no per-request record is written."""
    import logging

    from traceless.events import LOGGER_NAME

    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, request_events=request_events)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    finished = [r for r in caplog.records if '"event":"request.finished"' in r.getMessage()]
    assert len(finished) == (1 if request_events else 0)


def test_stream_chat_streams_the_same_answer_and_closing_it_aborts(tiny):
    conversation = [{"role": "user", "content": "hello there"}]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    whole = tiny.chat(conversation, params, use_tqdm=False)[0].outputs[0].text
    pieces = list(tiny.stream_chat(conversation, params))
    assert "".join(pieces) == whole and sum(1 for p in pieces if p) > 1  # token by token, not at the end
    stream = tiny.stream_chat(conversation, params)
    assert "".join(next(stream) for _ in range(4))
    assert tiny.engine.has_unfinished()
    stream.close()  # an answer cut short (Ctrl-C in `traceless chat`): the request is aborted
    tiny.engine.check_integrity()
    with pytest.raises(InvalidRequestError):
        next(tiny.stream_chat(conversation, SamplingParams(n=2)))
