"""The threads that prepare requests (templating, tokenization, grammar compilation) off the event
loop, each reachable on its own so that the idle scrub runs on every one of them.

A shared thread pool gives no way to send work to a given thread: a scrub task per thread with a
barrier between them breaks when one thread is still busy, or is not scheduled in time on a loaded
machine; the free thread then takes both tasks, and the other keeps the freed chunks of its last
request (its tcache, server/thread_cache.py) for as long as the server stays quiet. Here each
thread is its own single-thread executor (a lane): a scrub queued on a lane runs on that thread,
right after whatever it is doing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from traceless.server import thread_cache


class PrepThreads(Executor):
    """`num_threads` lanes; a job goes to the lane with the fewest jobs queued or running (a count,
    never what the job holds)."""

    def __init__(self, num_threads: int, name: str):
        self._lanes = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-{i}") for i in range(num_threads)]
        self._queued = [0] * num_threads
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            lane = min(range(len(self._lanes)), key=self._queued.__getitem__)
            self._queued[lane] += 1
        try:
            fut = self._lanes[lane].submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(lane)
            raise
        fut.add_done_callback(lambda _: self._finished(lane))
        return fut

    def _finished(self, lane: int) -> None:
        with self._lock:
            self._queued[lane] -= 1

    def scrub(self) -> list[Future]:
        """Queue thread_cache.scrub_thread on every lane: each thread overwrites its allocator cache
        and dead stack once its current job (if any) is done."""
        return [lane.submit(lambda: thread_cache.scrub_thread()) for lane in self._lanes]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for lane in self._lanes:
            lane.shutdown(wait=wait, cancel_futures=cancel_futures)
