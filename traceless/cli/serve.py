"""`traceless serve`: the plaintext OpenAI-compatible server."""
from __future__ import annotations

import argparse

from traceless.cli.engine_args import add_engine_args, engine_options, parse_size


def add_http_args(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=port)
    p.add_argument("--served-model-name", default=None, help="model name clients use (default: the model's name)")
    p.add_argument("--max-body-bytes", type=parse_size, default=None, help="largest request body (default 4MiB)")
    p.add_argument("--stream-padding", type=int, default=0, metavar="BYTES",
                   help="pad every streamed chunk to this many bytes (0 = off; at least 64)")
    p.add_argument("--stream-interval", type=int, default=1, metavar="TOKENS",
                   help="stream in groups of this many tokens instead of one chunk per step")


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (plaintext: local use, privacy-off baseline)")
    add_engine_args(serve)
    add_http_args(serve, 8000)
    serve.set_defaults(handler=_serve)


def stream_shape(args: argparse.Namespace):
    from traceless.server.stream_shape import StreamShape

    try:
        return StreamShape(args.stream_padding, args.stream_interval)
    except ValueError as exc:
        raise SystemExit(f"traceless: {exc}") from None


def build_async_engine(args: argparse.Namespace):
    from traceless.config import EngineConfig
    from traceless.entrypoints.build import build_engine
    from traceless.server.async_engine import AsyncEngine

    return AsyncEngine(build_engine(EngineConfig(model=args.model, dtype=args.dtype, **engine_options(args))))


def _serve(args: argparse.Namespace) -> int:
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn
    from traceless.server.app import DEFAULT_MAX_BODY_BYTES, ServerSettings, create_app

    configure_logging()
    engine = build_async_engine(args)
    settings = ServerSettings(args.served_model_name or engine.model_name,
                              args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
                              stream_shape=stream_shape(args))
    run_uvicorn(create_app(engine, settings), args.host, args.port, "server")
    return 0
