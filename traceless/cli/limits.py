"""The connection-limit options every service command takes (http/limits.py; docs/private-path.md,
"Limits")."""

from __future__ import annotations

import argparse


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be a positive number")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def add_limit_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection limits (docs/private-path.md, Limits)")
    g.add_argument(
        "--max-connections",
        type=_positive_int,
        default=1024,
        help="open connections; beyond them a JSON 503 (default 1024)",
    )
    g.add_argument(
        "--head-timeout",
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="time a client has to send a request's head (default 10)",
    )
    g.add_argument(
        "--body-timeout",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="time a client has to send a request's body after its head (default 30)",
    )


def connection_limits(args: argparse.Namespace):
    from traceless.http.limits import ConnectionLimits

    return ConnectionLimits(
        max_connections=args.max_connections, head_timeout_s=args.head_timeout, body_timeout_s=args.body_timeout
    )
