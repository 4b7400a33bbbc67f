"""The ballast: while a shaped stream holds the engine and no request runs, the engine decodes for no
one; a real request stops it and runs as it would alone; when the hold ends it stops, leaving
nothing behind (its KV blocks released and zeroed)."""

from __future__ import annotations

import asyncio
import time

import pytest

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


async def _collect(engine: AsyncEngine, rid: str) -> list[int]:
    ids: list[int] = []
    async for out in engine.generate(rid, [5, 6, 7], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)):
        ids += out.new_token_ids
    return ids


def test_the_engine_decodes_for_no_one_while_held_and_idle(engine):
    async def main():
        engine.start(asyncio.get_running_loop())
        alone = await _collect(engine, "alone")  # not held: no ballast
        assert await engine.call(lambda e: e.request_ids()) == [] and engine.ballast_steps == 0
        engine.keep_busy_while_held()
        engine.defer_idle(1.5)
        hold_ends = time.monotonic() + 1.5
        await asyncio.sleep(0.3)
        assert engine.ballast_steps > 0  # it decodes
        # a real request stops it, and runs as it runs alone (greedy: the same tokens)
        ids = await _collect(engine, "real")
        assert ids == alone
        before = engine.ballast_steps
        await asyncio.sleep(0.2)
        assert engine.ballast_steps > before  # back while still held
        await asyncio.sleep(max(0.0, hold_ends - time.monotonic()))
        deadline = time.monotonic() + 5
        while await engine.call(lambda e: e.request_ids()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        after = engine.ballast_steps
        await asyncio.sleep(0.3)
        assert await engine.call(lambda e: e.request_ids()) == [] and engine.ballast_steps == after  # over: gone
        await engine.call(lambda e: e.check_integrity())

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        engine.stop()


def test_off_by_default(engine):
    async def main():
        engine.start(asyncio.get_running_loop())
        engine.defer_idle(1.0)
        await asyncio.sleep(0.2)
        assert await engine.call(lambda e: e.request_ids()) == [] and engine.ballast_steps == 0

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        engine.stop()


def test_a_stopping_server_runs_no_ballast(engine):
    async def main():
        engine.start(asyncio.get_running_loop())
        engine.keep_busy_while_held()
        engine.defer_idle(10.0)
        await asyncio.sleep(0.3)
        assert engine.ballast_steps > 0
        engine.end_requests()
        await asyncio.sleep(0.3)
        assert await engine.call(lambda e: e.request_ids()) == []
        await engine.call(lambda e: e.check_integrity())

    try:
        asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        engine.stop()


def test_the_ballast_is_never_in_request_events(tiny_llama_dir, captured_events):
    """With --request-events a node logs each request's figures; the ballast is the server's own
    work, and an event per ballast run would show the operator when shaped streams were open."""
    engine = AsyncEngine(
        build_engine(
            EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=4 * 2**20, request_events=True)
        )
    )

    async def main():
        engine.start(asyncio.get_running_loop())
        engine.keep_busy_while_held()
        engine.defer_idle(1.0)
        await asyncio.sleep(0.3)
        assert engine.ballast_steps > 0
        await _collect(engine, "real")  # aborts the ballast, runs, and the ballast starts again
        await asyncio.sleep(1.2)  # the hold ends: the ballast is aborted again

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        engine.stop()
    finished = [e for e in captured_events() if e.get("event") == "request.finished"]
    assert len(finished) == 1 and finished[0]["finish"] == "length"
