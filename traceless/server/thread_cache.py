"""What a thread that ran request work still holds once idle, overwritten: glibc's per-thread
cache of freed chunks, and the dead part of its stack.

With PYTHONMALLOC=malloc and MALLOC_PERTURB_ (cli/scrubbing.py), glibc overwrites a chunk when it
is freed, except the chunks it parks in the freeing thread's cache (tcache: up to 7 chunks of each
size up to 1032 bytes), which keep their contents until that thread allocates again. A request's
last small strings (a prompt, a JSON value) land there and stay while the server is idle. Taking
every cached chunk out with zero-filled allocations, then freeing them, leaves zeros in the cache.
Each thread has its own cache, so each thread that touched request text runs this itself.

Native code (llguidance, the tokenizer) also leaves request content in the locals it had on the
calling thread's stack, below the frames now live; `scrub_thread` clears that too
(server/dead_stack.py). The CPU kernels and torch's CPU operators run on the engine thread's
OpenMP workers, whose stacks keep what they computed (tiles of results, spilled registers): the
engine thread clears those when idle (LLMEngine.scrub_compute_workers, model/layers/csrc/pool_stacks.c).
"""

from __future__ import annotations

from traceless.server.dead_stack import scrub_dead_stack

TCACHE_COUNT = 7  # glibc's default number of chunks per size
TCACHE_MAX_BYTES = 1032  # the largest request size tcache serves (64 sizes, 16 bytes apart)


def flush_thread_cache() -> None:
    """Replace every chunk in this thread's tcache with a zeroed one."""
    # bytearray(n) takes an (n + 1)-byte buffer and zero-fills it: n + 1 = 9, 25, ... 1033 meets
    # every tcache size once; one more than the cache holds takes out all of it.
    held = [bytearray(n) for n in range(8, TCACHE_MAX_BYTES + 8, 16) for _ in range(TCACHE_COUNT + 1)]
    del held


def scrub_thread() -> None:
    """This thread's allocator cache and dead stack overwritten (call it where the thread idles,
    not from inside request work: the stack below the caller is cleared)."""
    flush_thread_cache()
    scrub_dead_stack()
