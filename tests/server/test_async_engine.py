"""The engine thread survives any client cancellation: a request cancelled while its "add" is still
queued (a client that disconnects at the right moment) must neither kill the engine nor leave the
request behind."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from tests.support.async_engine import run_engine, settle_and_check
from traceless import SamplingParams
from traceless.config import EngineConfig
from traceless.entrypoints.build import build_engine
from traceless.server.async_engine import AsyncEngine


@pytest.fixture(params=[False, True], ids=["sync", "async-scheduling"])
def engine(tiny_llama_dir, request):
    return AsyncEngine(
        build_engine(
            EngineConfig(
                model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=4 * 2**20, async_scheduling=request.param
            )
        )
    )


async def _collect(engine: AsyncEngine, rid: str, n: int = 4) -> list[int]:
    ids: list[int] = []
    async for out in engine.generate(rid, [5, 6, 7], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)):
        ids += out.new_token_ids
    return ids


def test_a_request_cancelled_while_its_add_is_queued_leaves_the_engine_alive(engine):
    async def main():
        hold, held = threading.Event(), threading.Event()

        def block(_engine):  # keeps the engine thread busy so the adds below stay queued
            held.set()
            hold.wait(10)

        blocker = asyncio.ensure_future(engine.call(block))
        await asyncio.to_thread(held.wait, 10)
        tasks = [asyncio.ensure_future(_collect(engine, f"r{i}")) for i in range(8)]
        await asyncio.sleep(0.05)  # every task has queued its "add" and awaits it
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        hold.set()
        await blocker
        assert not engine.dead
        assert len(await _collect(engine, "after")) == 4
        assert not engine.dead
        await engine.call(lambda e: e.check_integrity())

    run_engine(engine, main)


def test_cancellation_at_random_moments_never_kills_the_engine(engine):
    rng = random.Random(7)

    async def main():
        for wave in range(30):
            tasks = [asyncio.ensure_future(_collect(engine, f"w{wave}-{i}", n=rng.randrange(1, 8))) for i in range(8)]
            await asyncio.sleep(rng.random() * 0.01)
            for t in tasks:
                if rng.random() < 0.7:
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert not engine.dead, f"engine died in wave {wave}"
        assert len(await _collect(engine, "after")) == 4
        await settle_and_check(engine)

    run_engine(engine, main)


def _break_next_step(engine: AsyncEngine, broken: list) -> None:
    """The engine's next step raises (a bug outside the per-batch error handling), once per call."""

    def patch(e):
        real = e.step

        def step():
            e.step = real  # the instance attribute goes; the class's step is back for the next call
            del e.step
            broken.append(e)
            raise RuntimeError("simulated engine bug")

        e.step = step

    return patch


def test_a_failed_step_fails_the_held_requests_and_a_fresh_engine_serves_on(engine):
    """The requests in flight fail with EngineDeadError; the old engine holds nothing and every KV
    block is zero; a fresh engine object serves the next request. The objects start-up froze out of
    the collector's reach (cli/serve.py) are back in it, so the failed engine can be collected."""
    import gc

    from traceless.errors import EngineDeadError

    async def main():
        broken: list = []
        gc.freeze()  # as build_async_engine does after start-up
        await engine.call(_break_next_step(engine, broken))
        results = await asyncio.gather(*(_collect(engine, f"r{i}", n=6) for i in range(3)), return_exceptions=True)
        assert all(isinstance(r, EngineDeadError) for r in results), results
        assert len(await _collect(engine, "after")) == 4
        assert not engine.dead and gc.get_freeze_count() == 0
        (old,) = broken
        assert await engine.call(lambda e: e is not old)
        assert not old.has_unfinished() and old.num_kv_blocks and not old._kv_memory.nonzero_blocks()
        await settle_and_check(engine)

    try:
        run_engine(engine, main)
    finally:
        gc.unfreeze()


def test_an_engine_that_keeps_failing_stops_for_good_and_says_so(engine):
    from traceless.errors import EngineDeadError

    async def main():
        stopped = asyncio.Event()
        engine.on_dead(stopped.set)
        for i in range(AsyncEngine.MAX_RESTARTS + 1):
            await engine.call(_break_next_step(engine, []))
            with pytest.raises(EngineDeadError):
                await _collect(engine, f"r{i}")
            while engine.restarting:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(stopped.wait(), 10)
        assert engine.dead
        with pytest.raises(EngineDeadError):
            await _collect(engine, "late")

    run_engine(engine, main)


def test_the_served_engine_freezes_what_start_up_built(tiny_llama_dir):
    """`traceless serve` and `node` build their engine through build_async_engine, which takes the
    start-up objects out of the collector's generations (a full collection walked them all before,
    ~3% of a decode step)."""
    import gc

    from traceless.cli.serve import build_async_engine
    from traceless_tools.cli import build_parser

    args = build_parser().parse_args(["serve", "--model", str(tiny_llama_dir), "--kv-cache-memory", "4MiB"])
    try:
        engine = build_async_engine(args)
        assert gc.get_freeze_count() > 10_000 and engine.model_name
    finally:
        gc.unfreeze()
