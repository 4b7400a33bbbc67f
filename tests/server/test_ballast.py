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


def test_the_ballast_outputs_are_formatted_on_the_loop_like_a_stream(tiny_llama_dir, monkeypatch):
    """The loop's work per token must not end with the answer either: the ballast's outputs reach
    the event loop and become a streamed completion's SSE events (then dropped), and a real
    request beside it is untouched."""
    from traceless.server import ballast_sink
    from traceless.server.openai_api import OpenAIService
    from traceless.server.responses import Formatter
    from traceless.server.telemetry import Telemetry

    formatted: list[int] = []

    class Counting(Formatter):
        def _event(self, obj: dict) -> bytes:
            out = super()._event(obj)
            formatted.append(len(out))
            return out

    monkeypatch.setattr(ballast_sink, "Formatter", Counting)
    engine = AsyncEngine(
        build_engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=4 * 2**20))
    )
    api = OpenAIService(engine, "tiny", Telemetry(engine=engine))

    async def main():
        engine.start(asyncio.get_running_loop())
        alone = await _collect(engine, "alone")
        sink = asyncio.create_task(ballast_sink.absorb(api))
        engine.keep_busy_while_held()
        engine.defer_idle(1.5)
        await asyncio.sleep(0.5)
        assert engine.ballast_steps > 0 and len(formatted) > 0  # its tokens became events on the loop
        assert await _collect(engine, "real") == alone  # a real request runs as alone
        engine.end_requests()  # the server stops: the sink ends with the engine's streams
        await asyncio.wait_for(sink, 5)
        await asyncio.get_running_loop().run_in_executor(None, engine.stop)  # before the loop closes

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        engine.stop()
        api.close()
