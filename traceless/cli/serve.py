"""`traceless serve`: the plaintext OpenAI-compatible server."""

from __future__ import annotations

import argparse
import atexit
import gc

from traceless.cli.engine_args import add_engine_args, config_errors, engine_options, parse_size
from traceless.cli.hardening import make_undumpable
from traceless.cli.limits import add_limit_args, connection_limits
from traceless.cli.scrubbing import add_scrub_arg, reexec_with_scrubbing

DEFAULT_EPSILON = 1.0  # server/telemetry.py's (not imported here: the CLI loads it lazily)


def add_http_args(p: argparse.ArgumentParser, port: int, metrics_port: int) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--port", type=int, default=port, help="port of the public listener")
    g = p.add_argument_group("operator telemetry (docs/telemetry.md)")
    g.add_argument(
        "--metrics-host", default="127.0.0.1", help="host of the operator's metrics listener (default loopback only)"
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        default=metrics_port,
        help="port of the operator's metrics listener; never the public --port (0 = no listener)",
    )
    g.add_argument(
        "--metrics-window",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="shortest telemetry window: request figures are published only as a window's aggregates",
    )
    g.add_argument(
        "--metrics-min-requests",
        type=int,
        default=20,
        metavar="K",
        help="a window is published only once it holds at least K requests (0 = every window: "
        "for audits and benchmarks only)",
    )
    g.add_argument(
        "--metrics-epsilon",
        type=_epsilon,
        default=DEFAULT_EPSILON,
        metavar="EPS",
        help=f"noise on every count a window publishes: the window is EPS-differentially private for "
        f"one request, discrete Laplace noise (default {DEFAULT_EPSILON}; off = exact figures, for "
        f"audits and benchmarks only)",
    )
    p.add_argument("--served-model-name", default=None, help="model name clients use (default: the model's name)")
    p.add_argument("--max-body-bytes", type=parse_size, default=None, help="largest request body (default 4MiB)")
    p.add_argument(
        "--stream-padding",
        type=int,
        default=0,
        metavar="BYTES",
        help="pad every streamed chunk to this many bytes (0 = off; at least 64)",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        metavar="TOKENS",
        help="stream in groups of this many tokens instead of one chunk per step",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="on Ctrl-C or SIGTERM, how long open requests may run on before they are ended (a "
        "stream with an error event and [DONE]; a second Ctrl-C ends them at once)",
    )


def _epsilon(value: str) -> float | None:
    if value == "off":
        return None
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError("a number, or off") from None


def shutdown_policy(args: argparse.Namespace, engine, component: str):
    """The bounded drain: open requests end through the engine when --shutdown-timeout is up."""
    from traceless.http.shutdown import Shutdown

    try:
        return Shutdown(args.shutdown_timeout, engine.end_requests if engine is not None else None)
    except ValueError as exc:
        raise SystemExit(f"traceless {component}: --shutdown-timeout: {exc}") from None


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (plaintext: local use, privacy-off baseline)")
    add_engine_args(serve)
    add_http_args(serve, 8000, 9000)
    add_access_args(serve)
    add_limit_args(serve)
    add_scrub_arg(serve)
    serve.set_defaults(handler=_serve)


def add_access_args(p: argparse.ArgumentParser) -> None:
    from traceless.cli.env import env_value

    g = p.add_argument_group("access")
    g.add_argument(
        "--api-key",
        default=env_value("TRACELESS_API_KEY") or env_value("VLLM_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every route but /health (env TRACELESS_API_KEY or "
        "VLLM_API_KEY: a variable keeps the key out of the process list)",
    )
    g.add_argument(
        "--allowed-origins",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin (e.g. https://app.example) allowed to call the server, with CORS headers; "
        "repeatable or comma-separated (default: none, requests with another Origin get 403)",
    )


def access_settings(args: argparse.Namespace) -> dict:
    origins = tuple(o.strip() for value in args.allowed_origins for o in value.split(",") if o.strip())
    if args.api_key is not None and not args.api_key.strip():
        raise SystemExit("traceless serve: --api-key must not be empty")
    return {"api_key": args.api_key, "allowed_origins": origins}


def stream_shape(args: argparse.Namespace):
    from traceless.server.stream_shape import StreamShape

    try:
        return StreamShape(args.stream_padding, args.stream_interval)
    except ValueError as exc:
        raise SystemExit(f"traceless: {exc}") from None


def window_policy(args: argparse.Namespace, component: str):
    """The telemetry window from the arguments, checked (call it before the engine loads)."""
    from traceless.server.telemetry import WindowPolicy

    if args.metrics_port and args.metrics_port == args.port:
        raise SystemExit(
            f"traceless {component}: --metrics-port must differ from --port (metrics are never "
            "served on the public port)"
        )
    try:
        return WindowPolicy(args.metrics_window, args.metrics_min_requests, args.metrics_epsilon)
    except ValueError as exc:
        raise SystemExit(f"traceless {component}: {exc}") from None


def reserve_ports(args: argparse.Namespace, component: str):
    """(public socket, operator socket or None): both addresses bound before the model loads, so a
    port in use stops the command at once with a message naming it."""
    from traceless.http.serve import reserve

    public = reserve(args.host, args.port, component)
    if args.metrics_port == 0:
        return public, None
    return public, reserve(args.metrics_host, args.metrics_port, component, "--metrics-port")


def telemetry_for(args: argparse.Namespace, engine, component: str, operator_sock=None):
    """The windowed telemetry and, unless --metrics-port is 0, the operator's listener serving it
    (on `operator_sock` when reserve_ports bound it)."""
    from traceless.http.serve import OperatorListener
    from traceless.server.operator_app import create_operator_app
    from traceless.server.telemetry import Telemetry

    telemetry = Telemetry(window_policy(args, component), engine)
    if args.metrics_port == 0:
        return telemetry, None
    return telemetry, OperatorListener(
        create_operator_app(telemetry, component), args.metrics_host, args.metrics_port, operator_sock
    )


ENGINE_STOPPED_EXIT = 70  # EX_SOFTWARE: the engine failed past its restart budget


def exit_when_engine_stops(engine, component: str) -> None:
    """When the engine stops for good, shut the server down (SIGTERM to this process: uvicorn's
    graceful path) so the command exits ENGINE_STOPPED_EXIT and its supervisor starts a fresh one."""
    import os
    import signal
    import sys

    def stop() -> None:
        print(
            f"traceless {component}: the engine failed repeatedly and stopped; exiting "
            f"({ENGINE_STOPPED_EXIT}) for a supervisor to restart",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    engine.on_dead(stop)


def build_async_engine(args: argparse.Namespace):
    from traceless.config import EngineConfig
    from traceless.entrypoints.build import build_engine
    from traceless.server.async_engine import AsyncEngine

    with config_errors():
        engine = AsyncEngine(build_engine(EngineConfig(model=args.model, dtype=args.dtype, **engine_options(args))))
    # What start-up built (the model, the libraries' objects) lives as long as the process: out of the
    # collector's generations, a full collection while serving walks only what requests made. Before,
    # collections were ~3% of a decode step of the built-in model. AsyncEngine._recover unfreezes,
    # so a failed engine's objects can still be collected.
    gc.collect()
    gc.freeze()
    # ... and back in at exit, so the interpreter's last collection frees them as before (native
    # extensions report instances still alive at their teardown)
    atexit.register(gc.unfreeze)
    return engine


def _serve(args: argparse.Namespace) -> int:
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn
    from traceless.server.app import DEFAULT_MAX_BODY_BYTES, ServerSettings, create_app

    window_policy(args, "server")  # a bad telemetry, access or shutdown setting fails before the model loads
    access_settings(args)
    shutdown_policy(args, None, "serve")
    if args.scrub_freed_memory:
        reexec_with_scrubbing()
    make_undumpable()  # before any request: no core file, no ptrace by the same user
    configure_logging()
    public, operator_sock = reserve_ports(args, "server")
    engine = build_async_engine(args)
    settings = ServerSettings(
        args.served_model_name or engine.model_name,
        args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
        stream_shape=stream_shape(args),
        **access_settings(args),
    )
    telemetry, operator = telemetry_for(args, engine, "server", operator_sock)
    # uvloop reads every connection's bytes into one long-lived buffer, which would keep the last
    # plaintext request until a later read overwrites it: a scrubbing server uses asyncio's loop,
    # which reads into fresh (freed, hence scrubbed) buffers. (A node reads only ciphertext.)
    loop = "asyncio" if args.scrub_freed_memory else "auto"
    exit_when_engine_stops(engine, "serve")
    run_uvicorn(
        create_app(engine, settings, telemetry),
        args.host,
        args.port,
        "server",
        loop=loop,
        operator=operator,
        limits=connection_limits(args),
        sock=public,
        shutdown=shutdown_policy(args, engine, "serve"),
    )
    return ENGINE_STOPPED_EXIT if engine.dead else 0
