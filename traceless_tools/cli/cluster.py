"""Commands `traceless issuer`, `traceless gateway` and `traceless relay` (docs/private-path.md).

Module-level imports stay light (the CLI imports every command module to build its parser);
each handler imports the service it starts. None of these services imports torch.
"""

from __future__ import annotations

import argparse
import sys

from traceless.cli.engine_args import parse_size
from traceless.cli.env import add_env_argument
from traceless.cli.limits import add_limit_args, connection_limits


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
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=port, help="port to listen on")
    add_limit_args(p)


def register(subparsers: argparse._SubParsersAction) -> None:
    issuer = subparsers.add_parser("issuer", help="Privacy Pass token issuer (API-key authenticated, rate limited)")
    add_env_argument(
        issuer,
        "--api-keys",
        "TRACELESS_API_KEYS_FILE",
        required=True,
        metavar="FILE",
        help="JSON object {api_key: user_id}",
    )
    issuer.add_argument("--tokens-per-window", type=_positive_int, default=1000, help="per-user quota (default 1000)")
    issuer.add_argument("--window-seconds", type=_positive_float, default=3600.0, help="quota window (default 3600)")
    issuer.add_argument("--max-batch", type=_positive_int, default=100, help="token requests per call (default 100)")
    issuer.add_argument(
        "--key-file",
        metavar="FILE",
        default=None,
        help="the token signing key, kept across restarts (created 0600 with a fresh key if "
        "missing); log its key once. Default: a fresh key at every start, which must be "
        "logged again before wallets take tokens",
    )
    issuer.add_argument(
        "--directory-port",
        type=int,
        default=None,
        help="also serve the key directory, and nothing else, on this port (a network policy "
        "can then let the gateway fetch the key without reaching the signing routes)",
    )
    _listen_args(issuer, 8091)
    issuer.set_defaults(handler=_run(_issuer))

    gateway = subparsers.add_parser(
        "gateway", help="untrusted gateway: node registry, routing, token check, forwarding"
    )
    add_env_argument(
        gateway,
        "--issuer",
        "TRACELESS_ISSUER_URL",
        metavar="URL",
        help="token issuer base URL (required unless --privacy off)",
    )
    gateway.add_argument(
        "--privacy", choices=("on", "off"), default="on", help="off skips the token check: benchmarks only (default on)"
    )
    add_env_argument(
        gateway, "--register-secret", "TRACELESS_REGISTER_SECRET", help="shared secret nodes present to register"
    )
    gateway.add_argument("--health-interval", type=_positive_float, default=5.0, help="seconds (default 5)")
    gateway.add_argument(
        "--unhealthy-after",
        type=_positive_int,
        default=3,
        help="consecutive failed checks before a node is dropped (default 3)",
    )
    gateway.add_argument("--max-body-bytes", type=parse_size, default=8 * 2**20, help="default 8MiB")
    gateway.add_argument(
        "--log", metavar="URL", help="transparency log URL (required): a node is admitted only if its release is logged"
    )
    gateway.add_argument("--log-public-key", help="the log's Ed25519 public key (base64), pinned (required)")
    gateway.add_argument(
        "--attester-policy",
        choices=("production", "development"),
        default="production",
        help="development admits software-attested nodes (any key, or only --attester-key ones); "
        "production refuses them (default)",
    )
    gateway.add_argument(
        "--attester-key", action="append", default=[], help="trusted attester public key (base64); repeatable"
    )
    gateway.add_argument(
        "--evidence-policy",
        metavar="FILE",
        help="JSON/YAML evidence policy (docs/attestation.md): nodes are admitted on hardware "
        "evidence that vouches for their key; the software attester only if it says "
        "development: true",
    )
    gateway.add_argument("--max-nodes", type=_positive_int, default=1024, help="registry cap (default 1024)")
    _listen_args(gateway, 8092)
    gateway.set_defaults(handler=_run(_gateway), check=_gateway_check)

    relay = subparsers.add_parser("relay", help="OHTTP relay: forwards to the gateway without the client's address")
    add_env_argument(relay, "--gateway", "TRACELESS_GATEWAY_URL", required=True, metavar="URL", help="gateway base URL")
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
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn
    from traceless_tools.cluster.issuer import IssuerConfig, create_issuer_app, load_api_keys
    from traceless_tools.cluster.issuer_ports import DirectoryOnlyPort

    api_keys = load_api_keys(args.api_keys)
    config = IssuerConfig(args.tokens_per_window, args.window_seconds, args.max_batch)
    if args.directory_port is not None and args.directory_port == args.port:
        raise CommandError("--directory-port must differ from --port")
    configure_logging()
    issuer = None
    if args.key_file is not None:
        from traceless_tools.cluster.issuer_key import IssuerKeyFileError, load_or_create_issuer

        try:
            issuer = load_or_create_issuer(args.key_file)
        except (IssuerKeyFileError, OSError) as exc:
            raise CommandError(f"--key-file: {exc}") from None
    app = create_issuer_app(config, api_keys, issuer=issuer)
    if args.directory_port is None:
        run_uvicorn(app, args.host, args.port, "issuer", limits=connection_limits(args))
    else:
        run_uvicorn(
            DirectoryOnlyPort(app, args.directory_port),
            args.host,
            args.port,
            "issuer",
            extra_ports=(args.directory_port,),
            limits=connection_limits(args),
        )
    return 0


def load_evidence_policy(path: str, command: str):
    """The AttestationPolicy in `path`; SystemExit naming the problem when it is not a valid one."""
    from traceless.privacy.attestation.policy_file import PolicyFileError, load_policy_file

    try:
        return load_policy_file(path)
    except PolicyFileError as e:
        raise SystemExit(f"traceless {command}: {e}") from None


def describe_policy(policy) -> str:
    """One line for the operator: what the evidence policy demands."""
    parts = [f"CPU {' or '.join(sorted(policy.cpu)).upper()}"] if policy.cpu else []
    parts += ["NVIDIA GPU"] if policy.gpu else []
    text = " + ".join(parts) if parts else "no hardware evidence"
    return text + ("; DEVELOPMENT: the software attester is accepted" if policy.allow_software else "")


def _gateway_check(args: argparse.Namespace) -> None:
    if args.privacy == "on" and not args.issuer:
        raise CommandError("--issuer URL is required (or --privacy off, for benchmarks only)")
    if not args.log or not args.log_public_key:
        raise CommandError("--log URL and --log-public-key are required: nodes are admitted by their logged release")


def _gateway(args: argparse.Namespace) -> int:
    import base64

    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn
    from traceless.privacy.attestation.policy import AttesterPolicy
    from traceless.privacy.translog.client import LogClient
    from traceless.privacy.translog.release_index import ReleaseIndex
    from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app
    from traceless_tools.cluster.issuer_directory import fetch_issuer_keys

    privacy = args.privacy == "on"
    _gateway_check(args)
    policy = AttesterPolicy(args.attester_policy)
    evidence_policy = load_evidence_policy(args.evidence_policy, "gateway") if args.evidence_policy else None
    config = GatewayConfig(
        issuer_url=args.issuer,
        privacy=privacy,
        register_secret=args.register_secret,
        health_interval_s=args.health_interval,
        unhealthy_after=args.unhealthy_after,
        max_body_bytes=args.max_body_bytes,
        attester_policy=policy,
        trusted_attester_keys=tuple(base64.b64decode(k) for k in args.attester_key),
        max_nodes=args.max_nodes,
        evidence_policy=evidence_policy,
    )
    keys = fetch_issuer_keys(args.issuer) if args.issuer else []
    releases = ReleaseIndex(LogClient(args.log, base64.b64decode(args.log_public_key)))
    configure_logging()
    if evidence_policy is not None:
        print(
            f"traceless gateway: evidence policy {evidence_policy.name!r}: {describe_policy(evidence_policy)}",
            flush=True,
        )
    elif policy is AttesterPolicy.DEVELOPMENT:
        print("traceless gateway: DEVELOPMENT attestation policy: software-attested nodes are admitted", flush=True)
    run_uvicorn(
        create_gateway_app(config, keys, releases=releases),
        args.host,
        args.port,
        "gateway",
        limits=connection_limits(args),
    )
    return 0


def _relay(args: argparse.Namespace) -> int:
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn
    from traceless_tools.cluster.relay import RelayConfig, create_relay_app

    config = RelayConfig(gateway_url=args.gateway, max_body_bytes=args.max_body_bytes)
    configure_logging()
    run_uvicorn(create_relay_app(config), args.host, args.port, "relay", limits=connection_limits(args))
    return 0
