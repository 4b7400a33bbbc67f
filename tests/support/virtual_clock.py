"""An asyncio event loop on virtual time: when every task waits on a timer, the clock jumps to the
next timer instead of sleeping. A test of a timer-driven protocol then reads exact instants
(loop.time() when something happened) that no machine load can disturb, and runs in no real time.

Only for code that waits on timers and on other tasks: a real wait (a socket, a thread's
call_soon_threadsafe) with no timer pending raises instead of hanging.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    def __init__(self, loop: VirtualClockLoop):
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None):
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("every task waits for something other than a timer: in virtual time it never comes")
        self._loop.now += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 1000.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on a VirtualClockLoop."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
