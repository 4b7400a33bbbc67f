"""Running an app under uvicorn: as a service (`run_uvicorn`, the commands) or on a free loopback
port in a thread (`serve_in_thread`: audits, benchmarks, tests). Access logs, the server header and
the date header are off everywhere: only schema events are logged."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from traceless.events import emit


def uvicorn_config(app: Any, **options: Any):
    import uvicorn

    return uvicorn.Config(app, access_log=False, log_config=None, server_header=False, date_header=False,
                          lifespan="on", **options)


def run_uvicorn(app: Any, host: str, port: int, component: str) -> None:
    import uvicorn

    server = uvicorn.Server(uvicorn_config(app, host=host, port=port))
    emit("service.started", component=component, port=port)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    emit("service.stopped", component=component)


@contextmanager
def serve_in_thread(app: Any = None, *, server: Any = None, what: str = "the loopback service") -> Iterator[str]:
    """Serve `app` (or run a prepared uvicorn `server`) on a free loopback port in a daemon thread,
    lifespan on; yields its base URL and stops the server on exit."""
    import uvicorn

    if (app is None) == (server is None):
        raise ValueError("give exactly one of app and server")
    if server is None:
        server = uvicorn.Server(uvicorn_config(app))
    # IPPROTO_TCP named: asyncio then sets TCP_NODELAY (else Nagle + delayed ACK: ~40 ms a call).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"{what} did not start")
            time.sleep(0.005)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
