"""Running an app under uvicorn: as a service (`run_uvicorn`, the commands) or on a free loopback
port in a thread (`serve_in_thread`: audits, benchmarks, tests). Access logs, the server header and
the date header are off everywhere: only schema events are logged."""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from traceless.errors import ConfigError
from traceless.events import emit
from traceless.http.limits import ConnectionLimits, uvicorn_options
from traceless.http.shutdown import GracefulServer, Shutdown


def uvicorn_config(app: Any, limits: ConnectionLimits | None = None, **options: Any):
    """uvicorn's Config for `app`, under `limits` (the documented defaults when None)."""
    import uvicorn

    options.setdefault("lifespan", "on")
    return uvicorn.Config(
        app,
        access_log=False,
        log_config=None,
        server_header=False,
        date_header=False,
        **uvicorn_options(limits or ConnectionLimits()),
        **options,
    )


@dataclass(frozen=True, slots=True)
class OperatorListener:
    """A second listener, for the operator only (metrics): its own host and port, never the public one.
    `sock`: the address already reserved (`reserve`), or None to bind it when it starts."""

    app: Any
    host: str
    port: int
    sock: socket.socket | None = None


def reserve(host: str, port: int, component: str, option: str = "--port") -> socket.socket:
    """Bind host:port now, without listening yet (a client is refused until the server runs), so a
    port in use stops the command at once, before a model loads, with a message that names it
    (ConfigError). Hand the socket to `run_uvicorn` / `OperatorListener`."""
    try:
        return _listen(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"cannot listen on {host}:{port}: the port is already in use (is another server "
                f"running there?); choose another {option}"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port} ({option}): {exc.strerror or type(exc).__name__}") from None


def run_uvicorn(
    app: Any,
    host: str,
    port: int,
    component: str,
    loop: str = "auto",
    operator: OperatorListener | None = None,
    extra_ports: tuple[int, ...] = (),
    limits: ConnectionLimits | None = None,
    sock: socket.socket | None = None,
    shutdown: Shutdown = Shutdown(),
) -> None:
    """`loop`: uvicorn's event loop ("auto": uvloop where installed; "asyncio": the standard one,
    which reads every packet into a fresh buffer instead of uvloop's long-lived receive buffer).
    `operator`: served from a thread of its own, started first; the public app runs here.
    `extra_ports`: the same server and app also listen on host:P for each P (the app can tell the
    ports apart by the ASGI scope's `server`). `limits`: connections, timeouts, lingering close
    (http/limits.py; its defaults when None). `sock`: host:port already reserved (`reserve`).
    `shutdown`: the bounded drain on Ctrl-C or SIGTERM (http/shutdown.py).
    A port in use is a ConfigError naming it; a server that does not start raises SystemExit."""

    sockets = [sock or reserve(host, port, component), *(reserve(host, p, component, "port") for p in extra_ports)]
    try:
        if operator is not None:
            _start_operator(operator, component)
        config = uvicorn_config(
            app, limits, host=host, port=port, loop=loop, timeout_graceful_shutdown=shutdown.uvicorn_timeout_s
        )
        server = GracefulServer(config, component, shutdown)
        emit("service.started", component=component, port=sockets[0].getsockname()[1], listener="public")
        interrupted = False
        try:
            server.run(sockets=sockets)
        except KeyboardInterrupt:
            interrupted = True
    finally:
        for s in sockets:
            s.close()
    if not server.started and not interrupted:
        raise SystemExit(f"traceless {component}: the server did not start (see the errors above)")
    emit("service.stopped", component=component)


def _start_operator(listener: OperatorListener, component: str) -> None:
    import uvicorn

    sock = listener.sock or reserve(listener.host, listener.port, component, "--metrics-port")
    server = uvicorn.Server(
        uvicorn_config(listener.app, host=listener.host, port=listener.port, lifespan="off", loop="asyncio")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="traceless-operator", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise SystemExit(
                f"traceless {component}: the operator listener could not listen on {listener.host}:{listener.port}"
            )
        time.sleep(0.01)
    emit("service.started", component=component, port=sock.getsockname()[1], listener="operator")


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


@contextmanager
def serve_in_thread(
    app: Any = None, *, server: Any = None, what: str = "the loopback service", limits: ConnectionLimits | None = None
) -> Iterator[str]:
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
