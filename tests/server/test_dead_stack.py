"""scrub_dead_stack clears a thread's stack below the caller: what deep calls left there is gone,
on a worker thread and on the main thread."""

from __future__ import annotations

import threading

from tests.support.process_memory import read_own_memory
from traceless.server.dead_stack import scrub_dead_stack, stack_bounds

LIVE_TOP = 256 << 10  # the top of a thread's stack holds its live frames while it waits; not searched
DEPTH = 600  # Python calls made from C (map): each level takes C stack, reaching well below LIVE_TOP


def _deep(n: int) -> int:
    return n if n == 0 else sum(map(_deep, [n - 1]))


def _nonzero_below_top(bounds: tuple[int, int]) -> int:
    low, high = bounds
    data = read_own_memory(low, high - LIVE_TOP)
    return len(data) - data.count(0)


def test_scrub_clears_what_deep_calls_left_on_a_worker_threads_stack():
    bounds: list[tuple[int, int]] = []
    dirty, go, scrubbed, leave = (threading.Event() for _ in range(4))

    def worker() -> None:
        bounds.append(stack_bounds())
        _deep(DEPTH)
        dirty.set()
        go.wait()
        scrub_dead_stack()
        scrubbed.set()
        leave.wait()

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert dirty.wait(30)
        low, high = bounds[0]
        assert high - low > 2 * LIVE_TOP
        assert _nonzero_below_top(bounds[0]) > 10_000  # the deep calls' frames are still there
        go.set()
        assert scrubbed.wait(30)
        assert _nonzero_below_top(bounds[0]) == 0
    finally:
        go.set()
        leave.set()
        t.join()


def test_scrub_runs_on_the_main_thread():
    low, high = stack_bounds()
    assert low < high
    _deep(DEPTH)
    scrub_dead_stack()  # the main thread's stack may not be mapped down to its limit: no error
    _deep(DEPTH)  # and the cleared pages are usable again
