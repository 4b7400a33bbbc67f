"""Commands `traceless issuer`, `traceless gateway` and `traceless relay` (docs/private-path.md).

Module-level imports stay light (the CLI imports every command module to build its parser);
each handler imports the service it starts. None of these services imports torch.
"""
from __future__ import annotations

import argparse
import sys

from traceless.cli.engine_args import parse_size


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive number: {text!r}")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return int(text)


def _listen_args(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=port)


def register(subparsers: argparse._SubParsersAction) -> None:
    issuer = subparsers.add_parser("issuer", help="Privacy Pass token issuer (API-key authenticated, rate limited)")
    issuer.add_argument("--api-keys", required=True, metavar="FILE", help="JSON object {api_key: user_id}")
    issuer.add_argument("--tokens-per-window", type=_positive_int, default=1000, help="per-user quota (default 1000)")
    issuer.add_argument("--window-seconds", type=_positive_float, default=3600.0, help="quota window (default 3600)")
    issuer.add_argument("--max-batch", type=_positive_int, default=100, help="token requests per call (default 100)")
    _listen_args(issuer, 8091)
    issuer.set_defaults(handler=_run(_issuer))

    gateway = subparsers.add_parser("gateway",
                                    help="untrusted gateway: node registry, routing, token check, forwarding")
    gateway.add_argument("--issuer", metavar="URL", help="token issuer base URL (required unless --privacy off)")
    gateway.add_argument("--privacy", choices=("on", "off"), default="on",
                         help="off skips the token check: benchmarks only (default on)")
    gateway.add_argument("--register-secret", default=None, help="shared secret nodes present to register")
    gateway.add_argument("--health-interval", type=_positive_float, default=5.0, help="seconds (default 5)")
    gateway.add_argument("--unhealthy-after", type=_positive_int, default=3,
                         help="consecutive failed checks before a node is dropped (default 3)")
    gateway.add_argument("--max-body-bytes", type=parse_size, default=8 * 2**20, help="default 8MiB")
    _listen_args(gateway, 8092)
    gateway.set_defaults(handler=_run(_gateway))

    relay = subparsers.add_parser("relay", help="OHTTP relay: forwards to the gateway without the client's address")
    relay.add_argument("--gateway", required=True, metavar="URL", help="gateway base URL")
    relay.add_argument("--max-body-bytes", type=parse_size, default=8 * 2**20, help="default 8MiB")
    _listen_args(relay, 8093)
    relay.set_defaults(handler=_run(_relay))


class CommandError(Exception):
    """A failure the command reports as one line on stderr with exit status 1."""


def _run(handler):
    def run(args: argparse.Namespace) -> int:
        from traceless.errors import TracelessError

        try:
            return handler(args)
        except (CommandError, TracelessError, OSError, ValueError) as e:
            print(f"traceless: error: {e}", file=sys.stderr)
            return 1

    return run


def _issuer(args: argparse.Namespace) -> int:
    from traceless.cluster.issuer import IssuerConfig, create_issuer_app, load_api_keys
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn

    api_keys = load_api_keys(args.api_keys)
    config = IssuerConfig(args.tokens_per_window, args.window_seconds, args.max_batch)
    configure_logging()
    run_uvicorn(create_issuer_app(config, api_keys), args.host, args.port, "issuer")
    return 0


def _gateway(args: argparse.Namespace) -> int:
    from traceless.cluster.gateway import GatewayConfig, create_gateway_app
    from traceless.cluster.issuer_directory import fetch_issuer_keys
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn

    privacy = args.privacy == "on"
    if privacy and not args.issuer:
        raise CommandError("--issuer URL is required (or --privacy off, for benchmarks only)")
    config = GatewayConfig(issuer_url=args.issuer, privacy=privacy, register_secret=args.register_secret,
                           health_interval_s=args.health_interval, unhealthy_after=args.unhealthy_after,
                           max_body_bytes=args.max_body_bytes)
    keys = fetch_issuer_keys(args.issuer) if args.issuer else []
    configure_logging()
    run_uvicorn(create_gateway_app(config, keys), args.host, args.port, "gateway")
    return 0


def _relay(args: argparse.Namespace) -> int:
    from traceless.cluster.relay import RelayConfig, create_relay_app
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn

    config = RelayConfig(gateway_url=args.gateway, max_body_bytes=args.max_body_bytes)
    configure_logging()
    run_uvicorn(create_relay_app(config), args.host, args.port, "relay")
    return 0
