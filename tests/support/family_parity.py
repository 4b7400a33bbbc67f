"""The runs the family parity tests share (dense families, mixtures of experts, gpt-oss): random
prompts, greedy parity on both CPU attention paths, parity under preemption with prefix hits, and
a request's tokens alone and among strangers (batch invariance)."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from tests.support.families import hf_greedy, hf_model, ours
from traceless import LLM

PREFIX_TAILS = (3, 20, 28, 9, 30)  # tails after a 24-token shared prefix


def random_prompts(seed: str, lengths) -> list[list[int]]:
    """Prompts of the given lengths, token ids 3..383 (no special tokens), reproducible from `seed`."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 384) for _ in range(n)] for n in lengths]


def transformers_greedy(path: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """transformers' n greedy tokens for each prompt, on the float32 model of `path`."""
    hf = hf_model(path)
    return [hf_greedy(hf, p, n) for p in prompts]


def parity_llms(path: Path):
    """(backend, LLM) on the native kernel with blocks of 4 tokens (a window's edge falls inside
    and across blocks) and on the torch path with 16, both under a small token budget: chunked
    prefill mixed with decodes in one step."""
    for backend, block_size in (("native", 4), ("torch", 16)):
        yield (
            backend,
            LLM(
                str(path),
                dtype="float32",
                kv_cache_memory=8 * 2**20,
                max_num_batched_tokens=24,
                attention_backend=backend,
                block_size=block_size,
            ),
        )


def assert_greedy_parity(path: Path, prompts: list[list[int]], want: list[list[int]], n: int) -> None:
    """Our n greedy tokens are transformers' (`want`): batched on both paths, and one request at a
    time (prompts[2:5]) on the native one."""
    for backend, llm in parity_llms(path):
        assert ours(llm, prompts, n, batched=True) == want, backend
        if backend == "native":
            assert ours(llm, prompts[2:5], n, batched=False) == want[2:5]
        llm.engine.check_integrity()


def kv_block_bytes(path: Path, block_size: int = 4) -> int:
    """Bytes of one float32 KV block of a tiny model directory: K and V of every layer slot a block
    holds (all layers; one layer group's worth for models with local and global layers)."""
    from traceless.model.hf_config import from_hf_config
    from traceless.model.hf_loader import read_json
    from traceless.model.layers.kv_cache import block_bytes

    return block_bytes(from_hf_config(read_json(path / "config.json")), block_size, torch.float32)


def shared_prefix_prompts(seed: str) -> tuple[list[int], list[list[int]]]:
    """A 24-token prefix and five prompts that start with it (tails of PREFIX_TAILS tokens)."""
    base = random_prompts(seed + "-base", (24,))[0]
    return base, [base + t for t in random_prompts(seed + "-tails", PREFIX_TAILS)]


def small_cache_llm(path: Path, blocks: int = 40) -> LLM:
    """An engine with a global prefix cache (hits between requests) of `blocks` blocks of 4 tokens:
    too few for the five shared-prefix prompts at once, so requests are preempted and recomputed."""
    return LLM(
        str(path),
        dtype="float32",
        block_size=4,
        kv_cache_memory=blocks * kv_block_bytes(path),
        max_num_batched_tokens=32,
        prefix_cache="global",
        max_model_len=100,
    )


def assert_preemption_parity(path: Path, seed: str, blocks: int = 40) -> None:
    """The shared-prefix prompts through the small cache: transformers' tokens, with preemptions."""
    _, prompts = shared_prefix_prompts(seed)
    want = transformers_greedy(path, prompts, 16)
    llm = small_cache_llm(path, blocks)
    assert ours(llm, prompts, 16, batched=True) == want
    assert llm.engine.kv_stats().preemptions > 0
    llm.engine.drop_prefix_cache()
    llm.engine.check_integrity()


def assert_same_alone_and_among_strangers(path: Path, seed: str, rounds: int) -> None:
    """A request's 24 greedy tokens alone equal its tokens in batches of strangers: some made of
    its own tokens (crowding the same experts), some random, the request at a random place."""
    llm = LLM(str(path), dtype="float32", kv_cache_memory=16 * 2**20, max_num_batched_tokens=64)
    victim = random_prompts(seed + "-victim", (17,))[0]
    alone = ours(llm, [victim], 24, batched=False)[0]
    rng = random.Random(seed)
    for round_ in range(rounds):
        crowd = [[rng.choice(victim) for _ in range(rng.randrange(20, 60))] for _ in range(3)]
        strangers = crowd + random_prompts(f"{seed}-strangers-{round_}", [rng.randrange(1, 50) for _ in range(4)])
        rng.shuffle(strangers)
        at = rng.randrange(len(strangers) + 1)
        batch = strangers[:at] + [victim] + strangers[at:]
        assert ours(llm, batch, 24, batched=True)[at] == alone, round_
    llm.engine.check_integrity()
