"""Running an app under uvicorn: as a service (`run_uvicorn`, the commands) or on a free loopback
port in a thread (`serve_in_thread`: audits, benchmarks, tests). Access logs, the server header and
the date header are off everywhere: only schema events are logged."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from traceless.events import emit
from traceless.http.limits import ConnectionLimits, uvicorn_options


def uvicorn_config(app: Any, limits: ConnectionLimits | None = None, **options: Any):
    """uvicorn's Config for `app`, under `limits` (the documented defaults when None)."""
    import uvicorn

    options.setdefault("lifespan", "on")
    return uvicorn.Config(app, access_log=False, log_config=None, server_header=False, date_header=False,
                          **uvicorn_options(limits or ConnectionLimits()), **options)


@dataclass(frozen=True, slots=True)
class OperatorListener:
    """A second listener, for the operator only (metrics): its own host and port, never the public one."""

    app: Any
    host: str
    port: int


def run_uvicorn(app: Any, host: str, port: int, component: str, loop: str = "auto",
                operator: OperatorListener | None = None, extra_ports: tuple[int, ...] = (),
                limits: ConnectionLimits | None = None) -> None:
    """`loop`: uvicorn's event loop ("auto": uvloop where installed; "asyncio": the standard one,
    which reads every packet into a fresh buffer instead of uvloop's long-lived receive buffer).
    `operator`: served from a thread of its own, started first; the public app runs here.
    `extra_ports`: the same server and app also listen on host:P for each P (the app can tell the
    ports apart by the ASGI scope's `server`). `limits`: connections, timeouts, lingering close
    (http/limits.py; its defaults when None)."""
    import uvicorn

    if operator is not None:
        _start_operator(operator, component)
    server = uvicorn.Server(uvicorn_config(app, limits, host=host, port=port, loop=loop))
    sockets = [_listen(host, p) for p in extra_ports]
    emit("service.started", component=component, port=port, listener="public")
    try:
        if sockets:
            server.run(sockets=[_listen(host, port), *sockets])
        else:
            server.run()
    except KeyboardInterrupt:
        pass
    finally:
        for sock in sockets:
            sock.close()
    emit("service.stopped", component=component)


def _start_operator(listener: OperatorListener, component: str) -> None:
    import uvicorn

    server = uvicorn.Server(uvicorn_config(listener.app, host=listener.host, port=listener.port, lifespan="off",
                                           loop="asyncio"))
    thread = threading.Thread(target=server.run, name="traceless-operator", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise SystemExit(f"traceless {component}: the operator listener could not listen on "
                             f"{listener.host}:{listener.port}")
        time.sleep(0.01)
    emit("service.started", component=component, port=listener.port, listener="operator")


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


@contextmanager
def serve_in_thread(app: Any = None, *, server: Any = None, what: str = "the loopback service",
                    limits: ConnectionLimits | None = None) -> Iterator[str]:
    """Serve `app` (or run a prepared uvicorn `server`) on a free loopback port in a daemon thread,
    lifespan on, under `limits` (with `app`); yields its base URL and stops the server on exit."""
    import uvicorn

    if (app is None) == (server is None):
        raise ValueError("give exactly one of app and server")
    if server is None:
        server = uvicorn.Server(uvicorn_config(app, limits))
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
