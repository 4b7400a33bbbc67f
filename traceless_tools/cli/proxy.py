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
    add_env_argument(
        p,
        "--log-public-key",
        "TRACELESS_LOG_PUBLIC_KEY",
        required=True,
        help="the log's Ed25519 public key (base64), pinned",
    )
    p.add_argument(
        "--attester-key",
        action="append",
        default=[],
        help="trusted attester public key (base64); repeatable (needed unless --evidence-policy)",
    )
    p.add_argument(
        "--evidence-policy",
        metavar="FILE",
        help="JSON/YAML evidence policy (docs/attestation.md): a node's key is trusted on hardware "
        "evidence that binds its attestation; the software attester only if the file says "
        "development: true (and its key is pinned with --attester-key)",
    )
    p.add_argument(
        "--witness-key",
        action="append",
        required=True,
        help="Ed25519 public key (base64) of a log witness: the log's tree heads count only with a "
        "fresh cosignature from one of these; repeatable",
    )
    p.add_argument(
        "--max-tree-head-age",
        type=float,
        default=600.0,
        help="seconds the newest witness cosignature of the log's tree head may be old (default 600)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="where the last verified tree head is kept (default: $XDG_STATE_HOME/traceless, "
        "else ~/.local/state/traceless)",
    )
    p.add_argument("--model", required=True, help="the model name the nodes serve")
    p.add_argument("--origin-name", default="traceless", help="origin name in the gateway's token challenges")
    p.add_argument(
        "--candidates",
        type=int,
        default=1000,
        help="how many of the model's nodes to ask for (default: all, up to the gateway's cap)",
    )
    p.add_argument(
        "--attester-policy",
        choices=("production", "development"),
        default="production",
        help="development also accepts the software attester (keys pinned with --attester-key), "
        "which proves nothing about the code a node runs; production refuses it (default)",
    )
    p.add_argument(
        "--attestation-max-age",
        type=float,
        default=60.0,
        help="seconds verified nodes are kept before their attestations are fetched again with a "
        "new nonce (0: a nonce per request; default 60)",
    )
    waive = p.add_argument_group(
        "benchmark-only waivers of the release policy (each weakens privacy; printed at start)"
    )
    waive.add_argument(
        "--allow-unpadded-releases", action="store_true", help="accept releases that do not hide shapes (--shape off)"
    )
    waive.add_argument(
        "--allow-request-events-releases",
        action="store_true",
        help="accept releases that log per-request events (request_events on)",
    )
    waive.add_argument(
        "--allow-dummy-weights-releases", action="store_true", help="accept releases that run random (dummy) weights"
    )
    p.add_argument("--host", default="127.0.0.1", help="address of the local OpenAI-compatible endpoint")
    p.add_argument("--port", type=int, default=8000, help="port of the local OpenAI-compatible endpoint")
    add_limit_args(p)
    p.set_defaults(handler=_proxy)


def _default_state_dir() -> str:
    import os
    from pathlib import Path

    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "traceless")


def _proxy(args: argparse.Namespace) -> int:
    from pathlib import Path

    from traceless.cli.paths import writable_dir
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn
    from traceless.privacy.attestation.policy import AttesterPolicy
    from traceless.privacy.translog.release_policy import ReleasePolicy
    from traceless_tools.cli.cluster import describe_policy, load_evidence_policy
    from traceless_tools.client.private_client import AsyncPrivateClient, ClientConfig
    from traceless_tools.client.proxy import LOOPBACK, create_proxy_app

    if args.host not in LOOPBACK:
        raise SystemExit("traceless proxy: it serves plaintext, so it binds loopback only (127.0.0.1 or ::1)")
    if not args.attester_key and not args.evidence_policy:
        raise SystemExit(
            "traceless proxy: give an --evidence-policy FILE (hardware-attested nodes) or the "
            "--attester-key of each node to trust"
        )
    evidence_policy = load_evidence_policy(args.evidence_policy, "proxy") if args.evidence_policy else None
    state_dir = str(writable_dir(args.state_dir or _default_state_dir(), "--state-dir"))
    configure_logging()
    api_key = Path(args.api_key_file).read_text().strip() if args.api_key_file else args.api_key
    config = ClientConfig(
        issuer_url=args.issuer,
        api_key=api_key,
        relay_url=args.relay,
        log_url=args.log,
        log_public_key=base64.b64decode(args.log_public_key),
        attester_keys=tuple(base64.b64decode(k) for k in args.attester_key),
        model=args.model,
        origin_name=args.origin_name,
        candidates=args.candidates,
        attester_policy=AttesterPolicy(args.attester_policy),
        attestation_max_age_s=args.attestation_max_age,
        evidence_policy=evidence_policy,
        witness_keys=tuple(base64.b64decode(k) for k in args.witness_key),
        max_tree_head_age_s=args.max_tree_head_age,
        state_dir=state_dir,
        release_policy=ReleasePolicy(
            allow_unpadded=args.allow_unpadded_releases,
            allow_request_events=args.allow_request_events_releases,
            allow_dummy_weights=args.allow_dummy_weights_releases,
        ),
    )
    for waiver in config.release_policy.waivers:
        print(
            f"traceless proxy: BENCHMARK-ONLY release policy waiver: {waiver} releases are accepted "
            "(never use this for private traffic)",
            flush=True,
        )
    if evidence_policy is not None:
        print(
            f"traceless proxy: evidence policy {evidence_policy.name!r}: {describe_policy(evidence_policy)}", flush=True
        )
    elif config.attester_policy is AttesterPolicy.DEVELOPMENT:
        print("traceless proxy: DEVELOPMENT attestation policy: software-attested nodes are accepted", flush=True)
    run_uvicorn(
        create_proxy_app(AsyncPrivateClient(config)), args.host, args.port, "proxy", limits=connection_limits(args)
    )
    return 0
