"""Run the real app under uvicorn on a loopback port in a background thread, for tests."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import weakref
from contextlib import contextmanager

import uvicorn

from traceless.http.limits import ConnectionLimits, uvicorn_options


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, app, engine, limits=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.engine = engine  # the AsyncEngine
        # the services' own connection limits (the documented defaults unless a test gives others)
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            access_log=False,
            log_config=None,
            lifespan="on",
            **uvicorn_options(limits or ConnectionLimits()),
        )
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.server.serve())

    def on_engine(self, fn, timeout=60):
        """Run fn(engine) on the engine thread and return its result."""
        return asyncio.run_coroutine_threadsafe(self.engine.call(fn), self.loop).result(timeout)

    def wait_until(self, predicate, timeout=30):
        """Poll predicate(engine) on the engine thread until it holds."""
        deadline = time.monotonic() + timeout
        while not self.on_engine(predicate):
            if time.monotonic() > deadline:
                raise TimeoutError("the engine never reached the expected state")
            time.sleep(0.02)

    def wait_idle(self, timeout=30):
        """Until no request runs and no shaped stream holds the engine (while one does, the ballast
        may be decoding for no one, and it starts again at any step)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.engine.holding and not self.on_engine(lambda e: e.has_unfinished()):
                return
            time.sleep(0.05)
        raise TimeoutError("engine still busy")

    @contextmanager
    def slowed(self, seconds_per_step: float):
        """Test-only: make every engine step take at least this long (for timing-sensitive tests)."""
        spy = _SPIES[self.engine]
        spy.delay_s = seconds_per_step
        try:
            yield
        finally:
            spy.delay_s = 0.0

    def check_integrity(self):
        self.wait_idle()
        self.on_engine(lambda e: e.check_integrity())


@contextmanager
def serve(app, engine, limits=None):
    s = Served(app, engine, limits)
    s.thread.start()
    deadline = time.monotonic() + 60
    while not s.server.started:
        if time.monotonic() > deadline or not s.thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield s
    finally:
        s.server.should_exit = True
        s.thread.join(timeout=30)


_SPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # AsyncEngine -> its ExecutorSpy


def make_served_app(engine_config, model_name=None, **settings):
    from tests.conftest import ExecutorSpy, llm_with_executor
    from traceless.server.app import ServerSettings, create_app
    from traceless.server.async_engine import AsyncEngine

    spies = []
    llm = llm_with_executor(engine_config, lambda real: spies.append(ExecutorSpy(real)) or spies[0])
    engine = AsyncEngine(llm.engine)
    _SPIES[engine] = spies[0]
    telemetry = settings.pop("telemetry", None)  # engine -> Telemetry, for tests that read the metrics
    app = create_app(
        engine,
        ServerSettings(model_name or engine.model_name, **settings),
        telemetry(engine) if telemetry is not None else None,
    )
    return app, engine
