"""Running a test's coroutine against an AsyncEngine: the engine started on a fresh event loop,
the coroutine bounded in time, the engine stopped whatever happens; and the end-of-test check."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from traceless.server.async_engine import AsyncEngine


def run_engine(engine: AsyncEngine, main: Callable[[], Awaitable[None]], timeout_s: float = 60) -> None:
    """Start `engine` on a new event loop, run main() there within timeout_s, then stop the engine."""

    async def started() -> None:
        engine.start(asyncio.get_running_loop())
        await main()

    try:
        asyncio.run(asyncio.wait_for(started(), timeout_s))
    finally:
        engine.stop()


async def settle_and_check(engine: AsyncEngine) -> None:
    """Wait until the engine holds no unfinished request, then check its integrity."""
    while await engine.call(lambda e: e.has_unfinished()):
        await asyncio.sleep(0.01)
    await engine.call(lambda e: e.check_integrity())
