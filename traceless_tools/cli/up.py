"""Command `traceless up`: the whole private path on loopback (nodes, gateway, relay, issuer,
log, proxy), for trying it and for the audits; a tool, outside the trusted core."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="all-in-one local deployment of the private path on loopback")
    up.add_argument("--nodes", type=int, default=2, help="how many nodes to start")
    up.add_argument("--capacities", default=None, help="comma-separated node capacities, e.g. 1,2")
    up.add_argument("--port", type=int, default=8000, help="port of the OpenAI-compatible proxy")
    up.add_argument(
        "--state-dir", default=None, help="where endpoints.json goes (default: a fresh temporary directory)"
    )
    up.add_argument("--node-args", default="", help='extra options for every node, e.g. "--dtype float32"')
    up.add_argument(
        "--gateway-args",
        default="",
        help='extra options for the gateway, e.g. "--health-interval 1 --unhealthy-after 2"',
    )
    up.add_argument(
        "--netns",
        action="store_true",
        help="each component in its own Linux network namespace with its own address, so every hop "
        "crosses a real interface (needs root; docs/deploy.md)",
    )
    up.set_defaults(handler=_up)


def _up(args: argparse.Namespace) -> int:
    from traceless_tools.local.up import Deployment, UpOptions

    caps = [int(c) for c in args.capacities.split(",")] if args.capacities else [1] * args.nodes
    if len(caps) != args.nodes or min(caps) < 1 or args.nodes < 1:
        raise SystemExit("traceless up: --capacities must list one positive capacity per node")
    if args.state_dir is not None:
        from traceless.cli.paths import writable_dir

        writable_dir(args.state_dir, "--state-dir")
    if not args.netns:  # the proxy's port, checked before anything starts (then freed for the proxy)
        from traceless.http.serve import reserve

        reserve("127.0.0.1", args.port, "up").close()
    opts = UpOptions(caps, args.port, args.state_dir, args.node_args.split(), tuple(args.gateway_args.split()))
    if args.netns:
        from traceless_tools.local.netns import available
        from traceless_tools.local.netns_up import NetnsDeployment

        ok, why = available()
        if not ok:
            raise SystemExit(f"traceless up: --netns: {why}")
        return NetnsDeployment(opts).run()
    return Deployment(opts).run()
