"""Run an LLMEngine on its own thread beside the asyncio event loop.

    event loop                               engine thread
    generate() --- ("add", id, ...) --->     engine.add_request()  (result/exception via a Future)
               <-- call_soon_threadsafe --   engine.step() -> [StepOutput] -> _dispatch() -> per-request queues
    cancel     --- ("abort", id) ------->    engine.abort()

The engine object is only ever touched by its thread. A client that goes away (its generator is
closed or cancelled) triggers an abort, which frees and zeroes the request's blocks.

If a step ever raises (a bug outside the per-batch error handling), the requests the engine held
fail with EngineDeadError, the engine releases and zeroes everything it held and a fresh engine
over the same model takes its place (`LLMEngine.restarted`); `restarting` is true meanwhile (so
/health says so; requests that arrive then wait for the fresh engine). After MAX_RESTARTS
failures within RESTART_WINDOW_S, or when the old engine cannot be released cleanly, it stays
dead: every caller gets EngineDeadError and the `on_dead` hooks run (the commands exit non-zero
then, for their supervisor to start a fresh process).
"""

from __future__ import annotations

import asyncio
import gc
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass

from traceless.engine.llm_engine import LLMEngine, ResidueStats, StepOutput
from traceless.errors import EngineDeadError, ShuttingDownError
from traceless.events import emit
from traceless.sampling_params import SamplingParams
from traceless.server.ballast import BALLAST_ID, Ballast
from traceless.server.dead_stack import check_available as check_dead_stack_scrubber
from traceless.server.thread_cache import scrub_thread
from traceless.structured.grammar import GrammarCompiler, Guide


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float
    spec: dict[str, float]  # SpecStats.as_dict()


class AsyncEngine:
    MAX_RESTARTS = 3
    RESTART_WINDOW_S = 600.0

    def __init__(self, engine: LLMEngine):
        check_dead_stack_scrubber()  # the idle work needs it: refuse now, not at the first idle period
        self._engine = engine
        self.model = engine.model
        self.tokenizer = engine.tokenizer
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, asyncio.Queue] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.dead = False  # stopped for good
        self.closing = False  # the server is stopping: open requests were ended, new ones are refused
        self.restarting = False  # a failed engine is being replaced
        self._idle = IdleWork(engine)
        self._ballast = Ballast()  # off until a shaped node turns it on (keep_busy_while_held)
        self._idle_hooks: list[Callable[[], None]] = []
        self._dead_hooks: list[Callable[[], None]] = []
        self._restarts: deque[float] = deque()  # monotonic times of the restarts within the window

    @property
    def model_name(self) -> str:
        return self.model.name

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    def stats(self) -> EngineStats:
        """Counts for allowlisted metrics (read from the event loop: plain numbers, no content)."""
        e = self._engine
        running = max(0, e.num_running - self._ballast.running(e))  # the ballast is no request
        return EngineStats(running, e.num_waiting, e.kv_usage(), e.spec_stats.as_dict())

    @property
    def residue(self) -> ResidueStats | None:
        """ResidueStats from the last complete idle scan (for allowlisted metrics), or None."""
        return self._idle.residue

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(target=self._run, args=(loop,), name="traceless-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # --- event-loop side ----------------------------------------------------------------------
    @property
    def grammar(self) -> GrammarCompiler:
        """The engine's grammar compiler (thread-safe: the server compiles on its own threads)."""
        return self._engine.grammar

    async def generate(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
        guide: Guide | None = None,
    ) -> AsyncIterator[StepOutput]:
        """Stream a request's StepOutputs. Validation errors raise before the first output;
        closing or cancelling the iterator aborts the request."""
        if self.dead:
            raise EngineDeadError("the engine has stopped")
        if self.closing:
            raise ShuttingDownError("the server is shutting down")
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = stream
        finished = False
        try:
            await asyncio.wrap_future(self._submit("add", request_id, prompt, params, cache_salt, guide))
            while True:
                out = await stream.get()
                if isinstance(out, BaseException):
                    raise out
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._submit("abort", request_id)

    async def ballast_outputs(self) -> AsyncGenerator[StepOutput, None]:
        """The ballast's outputs, handed to the loop like a request's (server/ballast_sink.py);
        ends when the server stops or the engine is dead, not when a failed engine restarts. One
        reader at a time."""
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[BALLAST_ID] = stream
        try:
            while True:
                out = await stream.get()
                if isinstance(out, BaseException):
                    if self.closing or self.dead:
                        return
                    continue  # a failed engine's run (it restarts): the next one's outputs follow
                yield out
        finally:
            if self._streams.get(BALLAST_ID) is stream:
                del self._streams[BALLAST_ID]

    def end_requests(self) -> None:
        """The server is stopping (call on the event loop): every open request fails with
        ShuttingDownError, which ends its stream properly (an error event, then [DONE]) and aborts
        it in the engine (its blocks freed and zeroed); requests that come later are refused."""
        self.closing = True
        self._fail_all(ShuttingDownError("the server is shutting down"))

    def _submit(self, kind: str, *args) -> Future:
        fut: Future = Future()
        self._commands.put((kind, args, fut))
        self._wake.set()
        return fut

    def _dispatch(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                stream.put_nowait(out)

    def _fail_all(self, exc: BaseException) -> None:
        for stream in self._streams.values():
            stream.put_nowait(exc)

    def _fail(self, request_ids: list[str], exc: BaseException) -> None:
        for rid in request_ids:
            stream = self._streams.get(rid)
            if stream is not None:
                stream.put_nowait(exc)

    # --- engine thread ------------------------------------------------------------------------
    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while not self._stopping:
                try:
                    self._turn(loop)
                except Exception:  # a bug outside the per-batch error handling
                    if not self._recover(loop):
                        return
        finally:
            try:
                self._engine.abort_all()
            finally:
                self._refuse_queued()

    def _turn(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the queued commands, then one step (or one slice of idle work)."""
        self._drain()
        # no ballast once the server stops: what it holds must be released with the requests
        self._ballast.update(self._engine, not self.closing and time.monotonic() < self._idle.busy_until)
        if not self._engine.has_unfinished():
            # Idle: housekeeping in small slices, so a request that arrives waits at most one slice.
            more = self._commands.empty() and self._idle.step()
            if self._idle.take_collected():
                for hook in self._idle_hooks:
                    loop.call_soon_threadsafe(hook)
            self._wake.wait(timeout=0.0 if more else 1.0)
            self._wake.clear()
            return
        self._idle.reset()
        outputs = self._engine.step()
        self._ballast.count(outputs)
        if outputs:  # the ballast's too: the loop formats and drops them (server/ballast_sink.py)
            loop.call_soon_threadsafe(self._dispatch, outputs)

    def _recover(self, loop: asyncio.AbstractEventLoop) -> bool:
        """The engine failed: its requests fail, it releases everything, and a fresh engine takes
        over unless the restart budget is spent. Returns whether serving goes on."""
        self.restarting = True
        gc.unfreeze()  # the failed engine's objects (frozen after start-up, cli/serve.py) collectable again
        held = self._engine.request_ids()
        emit("engine.step_failed", num_requests=len(held), error_kind="internal")
        loop.call_soon_threadsafe(self._fail, held, EngineDeadError("the engine failed; the request was dropped"))
        now = time.monotonic()
        while self._restarts and now - self._restarts[0] > self.RESTART_WINDOW_S:
            self._restarts.popleft()
        try:
            fresh: LLMEngine | None = self._engine.restarted()
        except Exception:
            fresh = None
        if fresh is None or len(self._restarts) >= self.MAX_RESTARTS:
            self.dead, self.restarting = True, False
            emit("engine.stopped", restarts=len(self._restarts))
            loop.call_soon_threadsafe(self._fail_all, EngineDeadError("the engine has stopped"))
            for hook in self._dead_hooks:
                loop.call_soon_threadsafe(hook)
            return False
        self._restarts.append(now)
        self._engine, self._idle = fresh, IdleWork(fresh)
        self.restarting = False
        emit("engine.restarted", restarts=len(self._restarts))
        return True

    def _refuse_queued(self) -> None:
        """The thread is ending: commands still queued will never run, so their callers get an error
        instead of waiting forever."""
        while True:
            try:
                _kind, _args, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(EngineDeadError("the engine has stopped"))

    def _drain(self) -> None:
        while True:
            try:
                kind, args, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                # The caller went away while its command was queued (a client that disconnected):
                # nothing waits for the result, and for an "add" the caller's abort follows in the
                # queue. A running future can no longer be cancelled, so the result below is safe.
                continue
            try:
                if kind == "add":
                    fut.set_result(self._engine.add_request(*args))
                elif kind == "abort":
                    fut.set_result(self._engine.abort(*args))
                elif kind == "call":
                    fut.set_result(args[0](self._engine))
            except Exception as exc:
                fut.set_exception(exc)

    def on_dead(self, hook: Callable[[], None]) -> None:
        """Run `hook` on the event loop once the engine has stopped for good (restart budget spent)."""
        self._dead_hooks.append(hook)

    def on_idle(self, hook: Callable[[], None]) -> None:
        """Run `hook` on the event loop each time the engine thread has collected garbage after a
        quiet spell (the server scrubs its other threads' allocator caches then)."""
        self._idle_hooks.append(hook)

    def note_activity(self) -> None:
        """A request ended without necessarily reaching the engine (e.g. refused while parsed):
        the idle work collects garbage again once quiet, so its text, held in reference cycles
        (an exception's traceback frames), is freed and scrubbed too."""
        self._idle.activity.set()
        self._wake.set()

    def defer_idle(self, seconds: float) -> None:
        """Hold the idle work off for `seconds` from now (called by a shaped stream at its start and
        each tick): a garbage collection holds the interpreter long enough to stall the stream's
        timer, and run when the engine went idle it would fall at a fixed delay after the answer's
        last token, showing the relay how long the answer was. A stream that stops calling lets it
        run again within `seconds`: nothing can hold it off for good."""
        self._idle.busy_until = max(self._idle.busy_until, time.monotonic() + seconds)
        if self._ballast.enabled:
            self._wake.set()  # an idle engine thread waits up to a second: the ballast starts now

    def keep_busy_while_held(self, enabled: bool = True) -> None:
        """While defer_idle holds the idle work off (a shaped stream is open) and no request runs,
        decode for no one (server/ballast.py), so the engine's load does not end with an answer."""
        self._ballast.enabled = enabled

    @property
    def holding(self) -> bool:
        """Whether an open shaped stream holds the idle work off now (and the ballast may run)."""
        return time.monotonic() < self._idle.busy_until

    @property
    def ballast_steps(self) -> int:
        return self._ballast.steps

    async def call(self, fn):
        """Run fn(engine) on the engine thread (e.g. check_integrity in tests)."""
        return await asyncio.wrap_future(self._submit("call", fn))


class IdleWork:
    """What the engine thread does while no request runs, one short slice per call:

    1. expire cached prefix blocks past their TTL (engine.tick);
    (nothing more while a shaped stream holds it off: AsyncEngine.defer_idle)
    2. after IDLE_GC_S of quiet, one garbage collection, so request objects caught in reference
       cycles are freed (and, with freed-memory scrubbing, overwritten) instead of lingering, and
       this thread's allocator cache and dead stack, and its OpenMP workers' dead stacks, are
       overwritten (server/thread_cache.py);
    3. every SCAN_INTERVAL_S, a scan of the whole KV cache for non-zero blocks, SCAN_SLICE blocks
       at a time, whose totals the allowlisted residue metrics report.
    """

    IDLE_GC_S = 0.2
    SCAN_INTERVAL_S = 3.0
    SCAN_SLICE = 128

    def __init__(self, engine: LLMEngine):
        self._engine = engine
        self.activity = threading.Event()  # set from the event loop: a request ended (note_activity)
        self.busy_until = 0.0  # monotonic time before which open streams hold the work below off
        self.residue: ResidueStats | None = None
        self._idle_since: float | None = None
        self._collected = True
        self._just_collected = False
        self._cursor = 0
        self._nonzero = 0
        self._scanned_at = -1e9

    def take_collected(self) -> bool:
        """True once after each idle garbage collection."""
        done, self._just_collected = self._just_collected, False
        return done

    def reset(self) -> None:
        """A request is running: start over next time the engine goes idle."""
        self._idle_since, self._collected, self._cursor, self._nonzero = None, False, 0, 0

    def step(self) -> bool:
        """Do one slice of idle work; True if there is more to do right away."""
        now = time.monotonic()
        if self.activity.is_set():
            self.activity.clear()
            self._idle_since, self._collected = now, False
        if self._idle_since is None:
            self._idle_since = now
        self._engine.tick(now)
        if now < self.busy_until:  # start over, with a full quiet spell, once the streams have ended
            self._idle_since, self._collected, self._cursor, self._nonzero = now, False, 0, 0
            return False
        if not self._collected:
            if now - self._idle_since < self.IDLE_GC_S:
                return False  # wait for quiet (the wake-up timeout brings us back)
            gc.collect()
            scrub_thread()  # this thread's cached freed chunks (left unscrubbed by glibc) and dead stack
            self._engine.scrub_compute_workers()  # its OpenMP workers' dead stacks (what the kernels computed)
            self._collected = self._just_collected = True
            return True
        if self._cursor == 0 and now - self._scanned_at < self.SCAN_INTERVAL_S:
            return False
        num_blocks = self._engine.num_kv_blocks
        end = min(self._cursor + self.SCAN_SLICE, num_blocks)
        self._nonzero += self._engine.count_nonzero_blocks(self._cursor, end)
        self._cursor = end
        if end < num_blocks:
            return True
        self.residue = self._engine.residue_stats(self._nonzero)
        self._cursor, self._nonzero, self._scanned_at = 0, 0, time.monotonic()
        return False
