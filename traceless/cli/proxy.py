"""`traceless proxy` (argument parsing only)."""
from __future__ import annotations

import argparse
import base64

from traceless.cli.env import add_env_argument
from traceless.cli.limits import add_limit_args, connection_limits


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("proxy", help="OpenAI-compatible endpoint on loopback that forwards through the private path")
    add_env_argument(p, "--issuer", "TRACELESS_ISSUER_URL", required=True, help="token issuer URL")
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--api-key-file", help="file holding your issuer API key")
    key.add_argument("--api-key", help="your issuer API key (visible to other local users via ps; prefer the file)")
    add_env_argument(p, "--relay", "TRACELESS_RELAY_URL", required=True, help="OHTTP relay URL")
    add_env_argument(p, "--log", "TRACELESS_LOG_URL", required=True, help="transparency log URL")
    add_env_argument(p, "--log-public-key", "TRACELESS_LOG_PUBLIC_KEY", required=True,
                     help="the log's Ed25519 public key (base64), pinned")
    p.add_argument("--attester-key", action="append", required=True,
                   help="trusted attester public key (base64); repeatable")
    p.add_argument("--model", required=True)
    p.add_argument("--origin-name", default="traceless", help="origin name in the gateway's token challenges")
    p.add_argument("--candidates", type=int, default=1000,
                   help="how many of the model's nodes to ask for (default: all, up to the gateway's cap)")
    p.add_argument("--attester-policy", choices=("production", "development"), default="production",
                   help="development also accepts the software attester (keys pinned with --attester-key), "
                        "which proves nothing about the code a node runs; production refuses it (default)")
    p.add_argument("--attestation-max-age", type=float, default=60.0,
                   help="seconds verified nodes are kept before their attestations are fetched again with a "
                        "new nonce (0: a nonce per request; default 60)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    add_limit_args(p)
    p.set_defaults(handler=_proxy)


def _proxy(args: argparse.Namespace) -> int:
    from pathlib import Path

    from traceless.client.private_client import AsyncPrivateClient, ClientConfig
    from traceless.client.proxy import LOOPBACK, create_proxy_app
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn
    from traceless.privacy.attestation.policy import AttesterPolicy

    if args.host not in LOOPBACK:
        raise SystemExit("traceless proxy: it serves plaintext, so it binds loopback only (127.0.0.1 or ::1)")
    configure_logging()
    api_key = Path(args.api_key_file).read_text().strip() if args.api_key_file else args.api_key
    config = ClientConfig(
        issuer_url=args.issuer, api_key=api_key, relay_url=args.relay, log_url=args.log,
        log_public_key=base64.b64decode(args.log_public_key),
        attester_keys=tuple(base64.b64decode(k) for k in args.attester_key), model=args.model,
        origin_name=args.origin_name, candidates=args.candidates,
        attester_policy=AttesterPolicy(args.attester_policy), attestation_max_age_s=args.attestation_max_age,
    )
    if config.attester_policy is AttesterPolicy.DEVELOPMENT:
        print("traceless proxy: DEVELOPMENT attestation policy: software-attested nodes are accepted", flush=True)
    run_uvicorn(create_proxy_app(AsyncPrivateClient(config)), args.host, args.port, "proxy",
                limits=connection_limits(args))
    return 0
