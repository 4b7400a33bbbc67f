"""KV offload under memory pressure: same outputs as without pressure, no plaintext or canary in the
spill files while they exist, an empty spill directory afterwards."""

import random

import pytest

from tests.support.fsize import file_size_limit
from traceless import LLM, SamplingParams
from traceless.runner.offload import KVOffloader


def prompts(n, seed=0):
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(3, 384) for _ in range(rng.randrange(20, 60))]} for _ in range(n)]


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_outputs_under_pressure_with_offload_equal_the_unpressured_run(tiny_llama_dir, tmp_path, mode):
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ps = prompts(12)
    roomy = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, block_size=4)
    want = [o.outputs[0].token_ids for o in roomy.generate(ps, greedy, use_tqdm=False)]
    spill = tmp_path / "spill"
    tight = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        kv_cache_memory=61 * 2048,
        block_size=4,
        max_model_len=128,
        kv_offload=mode,
        kv_offload_dir=str(spill) if mode == "disk" else None,
    )
    got = [o.outputs[0].token_ids for o in tight.generate(ps, greedy, use_tqdm=False)]
    kv = tight.engine.kv_stats()
    assert kv.offload_bytes_out > 0 and kv.offload_bytes_in == kv.offload_bytes_out  # swapped, and all came back
    assert got == want
    tight.engine.check_integrity()
    if mode == "disk":
        assert not any(spill.iterdir())


@pytest.mark.slow
def test_spill_files_hold_no_canary_and_no_plaintext_kv(tmp_path, monkeypatch):
    spill = tmp_path / "spill"
    seen = []
    real_gather, real_save = KVOffloader._gather, KVOffloader.save

    def gather(self, block_ids):
        staged = real_gather(self, block_ids)
        seen.append({"plain": staged.clone()})
        return staged

    def save(self, request_id, block_ids):
        real_save(self, request_id, block_ids)
        seen[-1]["file"] = self._swapped[request_id].path.read_bytes()  # the spill file as it is on disk

    monkeypatch.setattr(KVOffloader, "_gather", gather)
    monkeypatch.setattr(KVOffloader, "save", save)
    # float32 on every CPU (auto is bfloat16 only on AVX-512): 32 MiB hold ~720 tokens, fewer than the ~900
    # the 8 requests reach, so it must swap
    llm = LLM(
        dtype="float32",
        kv_cache_memory=32 * 2**20,
        max_model_len=512,
        kv_offload="disk",
        kv_offload_dir=str(spill),
        max_num_seqs=8,
    )
    canary = "CANARY-7f3e2a9b41d0"
    ps = [f"Write a long story about {canary} number {i}." for i in range(8)]
    llm.generate(ps, SamplingParams(temperature=0, max_tokens=96, ignore_eos=True), use_tqdm=False)
    assert seen, "the workload was meant to run out of KV blocks and swap"
    for item in seen:
        data, plain = item["file"], item["plain"].numpy().tobytes()
        assert canary.encode() not in data
        nonzero = [i for i in range(0, len(plain) - 48, 4096) if any(plain[i : i + 48])][:64]
        assert nonzero and all(plain[i : i + 48] not in data for i in nonzero)
    llm.engine.check_integrity()
    assert not any(spill.iterdir())


def test_speculation_offload_and_prefix_caching_together_keep_outputs_and_leave_nothing(tiny_llama_dir, tmp_path):
    """All the stateful speed features at once, under memory pressure: same greedy outputs as a plain
    roomy run; afterwards no block, cache entry, spill file or draft is left."""
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    shared = [7] * 24  # a common prefix, so salted requests hit each other's cache
    ps = [{"prompt_token_ids": shared + p["prompt_token_ids"]} for p in prompts(10, seed=4)]
    want = [
        o.outputs[0].token_ids
        for o in LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, prefix_cache="off").generate(
            ps, greedy, use_tqdm=False
        )
    ]
    spill = tmp_path / "spill"
    llm = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        kv_cache_memory=61 * 2048,
        block_size=4,
        max_model_len=128,
        kv_offload="disk",
        kv_offload_dir=str(spill),
        speculative="ngram",
        prefix_cache="isolated",
        prefix_cache_ttl=0.0,
    )
    salted = [{**p, "cache_salt": "q" * 24} for p in ps]
    got = [o.outputs[0].token_ids for o in llm.generate(salted, greedy, use_tqdm=False)]
    assert got == want
    assert llm.engine.kv_stats().offload_bytes_out > 0  # the pressure really made it swap
    llm.engine.drop_prefix_cache()
    llm.engine.check_integrity()
    assert not any(spill.iterdir())


@pytest.mark.parametrize("damage", ["tamper", "truncate", "remove"])
def test_a_spill_file_that_fails_to_decrypt_fails_that_request_only(tiny_llama_dir, tmp_path, monkeypatch, damage):
    """A spill file damaged while its request is swapped out (tampered, truncated, removed by a tmp
    cleaner): that request ends with finish_reason "error", its blocks zeroed; every other request
    finishes exactly as without memory pressure, and the engine holds nothing afterwards."""
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ps = prompts(12)
    roomy = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, block_size=4)
    want = [o.outputs[0].token_ids for o in roomy.generate(ps, greedy, use_tqdm=False)]
    spill = tmp_path / "spill"
    damaged: list[str] = []
    real_save = KVOffloader.save

    def save(self, request_id, block_ids):
        real_save(self, request_id, block_ids)
        if damaged:
            return
        path = self._swapped[request_id].path
        damaged.append(request_id)
        if damage == "remove":
            path.unlink()
        else:
            data = bytearray(path.read_bytes())
            if damage == "tamper":
                data[len(data) // 2] ^= 0x40
            else:
                del data[len(data) // 2 :]
            path.write_bytes(bytes(data))

    monkeypatch.setattr(KVOffloader, "save", save)
    tight = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        kv_cache_memory=61 * 2048,
        block_size=4,
        max_model_len=128,
        kv_offload="disk",
        kv_offload_dir=str(spill),
    )
    outs = tight.generate(ps, greedy, use_tqdm=False)
    assert len(damaged) == 1, "the workload was meant to swap at least one request out"
    reasons = [o.outputs[0].finish_reason for o in outs]
    assert reasons.count("error") == 1
    failed = reasons.index("error")
    for i, o in enumerate(outs):
        if i != failed:
            assert list(o.outputs[0].token_ids) == list(want[i]) and o.outputs[0].finish_reason == "length"
    tight.engine.check_integrity()  # no request, owned block, sealed KV or non-zero block is left
    assert not any(spill.iterdir())


def test_a_full_spill_directory_fails_only_the_requests_it_could_not_hold(tiny_llama_dir, tmp_path):
    """Spill files larger than the room left (a file-size limit: writes past it fail as on a full
    disk): the requests whose swap-out failed end with finish_reason "error", their blocks zeroed and
    no partial file left; every other request finishes as without memory pressure, and the engine
    goes on serving."""
    greedy = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ps = prompts(12)
    roomy = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, block_size=4)
    want = [o.outputs[0].token_ids for o in roomy.generate(ps, greedy, use_tqdm=False)]
    spill = tmp_path / "spill"
    tight = LLM(
        str(tiny_llama_dir),
        dtype="float32",
        kv_cache_memory=61 * 2048,
        block_size=4,
        max_model_len=128,
        kv_offload="disk",
        kv_offload_dir=str(spill),
    )
    with file_size_limit(20 * 1024):  # a block is 2 KiB here: a request holding over 10 blocks does not fit
        outs = tight.generate(ps, greedy, use_tqdm=False)
    reasons = [o.outputs[0].finish_reason for o in outs]
    assert 1 <= reasons.count("error") < len(ps), reasons
    for i, o in enumerate(outs):
        if reasons[i] != "error":
            assert list(o.outputs[0].token_ids) == list(want[i]) and o.outputs[0].finish_reason == "length"
    tight.engine.check_integrity()
    assert not any(spill.iterdir())
    again = tight.generate(ps[:2], greedy, use_tqdm=False)  # the engine still serves
    assert [list(o.outputs[0].token_ids) for o in again] == [list(w) for w in want[:2]]
