"""Every request-preparation thread has its allocator cache and dead stack overwritten once the
server is quiet, even when one of them is still busy when the quiet spell starts, or slow to be
scheduled on a loaded machine."""

import threading
import time

from traceless.server import thread_cache
from traceless.server.prep_threads import PrepThreads


def test_every_prep_thread_is_scrubbed_after_its_last_job(monkeypatch):
    scrubbed: dict[int, float] = {}
    monkeypatch.setattr(
        thread_cache, "scrub_thread", lambda: scrubbed.setdefault(threading.get_ident(), time.monotonic())
    )
    pool = PrepThreads(2, "test-prep")
    both = threading.Barrier(2)
    idents = {f.result() for f in [pool.submit(lambda: (both.wait(), threading.get_ident())[1]) for _ in range(2)]}
    assert len(idents) == 2  # the two jobs ran side by side, one on each thread
    last_job: dict[int, float] = {}

    def job(seconds: float) -> None:
        time.sleep(seconds)
        last_job[threading.get_ident()] = time.monotonic()

    busy = pool.submit(job, 1.5)  # still preparing a request when the server goes quiet
    time.sleep(0.05)
    for f in pool.scrub():
        f.result(timeout=10)
    busy.result()
    pool.shutdown()
    assert set(scrubbed) == idents
    assert all(scrubbed[t] >= last_job[t] for t in last_job)


def test_jobs_go_to_the_idle_thread():
    pool = PrepThreads(2, "test-prep")
    release = threading.Event()
    busy = pool.submit(release.wait)
    started = time.monotonic()
    assert pool.submit(lambda: 1).result(timeout=5) == 1  # not queued behind the busy one
    assert time.monotonic() - started < 2.0 and not busy.done()
    release.set()
    busy.result()
    pool.shutdown()
