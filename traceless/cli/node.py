"""`traceless node` and `traceless up` (argument parsing only)."""
from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from traceless.cli.engine_args import add_engine_args
from traceless.cli.serve import add_http_args


def add_node_args(p: argparse.ArgumentParser) -> None:
    add_engine_args(p)
    add_http_args(p, 8100)
    p.add_argument("--gateway", default=None, help="gateway URL to register with")
    p.add_argument("--capacity", type=int, default=1, help="routing weight announced to the gateway")
    p.add_argument("--public-url", default=None, help="URL the gateway reaches this node at (default http://HOST:PORT)")
    p.add_argument("--register-interval", type=float, default=60.0, help="seconds between re-registrations")
    p.add_argument("--attestation-ttl", type=int, default=300, help="seconds an attestation document is valid")
    p.add_argument("--scrub-freed-memory", action=argparse.BooleanOptionalAction, default=True,
                   help="have the allocator overwrite freed heap memory, so request text left in freed Python "
                        "objects does not linger (PYTHONMALLOC=malloc + glibc MALLOC_PERTURB_; default on)")


def node_measured_config(args: argparse.Namespace) -> dict:
    """The node configuration that goes into its measurement: everything that changes what the
    node does with a request. Placement and sizing (host, port, memory, capacity) are left out,
    so one logged release covers every deployment of it."""
    return {
        "component": "node", "dtype": args.dtype, "block_size": args.block_size, "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_queued_requests": args.max_queued_requests, "attention_backend": args.attention_backend,
        "served_model_name": args.served_model_name, "attestation_ttl": args.attestation_ttl,
        "prefix_cache": args.prefix_cache, "prefix_cache_ttl": args.prefix_cache_ttl,
        "public_prefixes": [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in args.public_prefix],
        "stream_padding": args.stream_padding, "stream_interval": args.stream_interval,
        "kv_offload": args.kv_offload, "scrub_freed_memory": args.scrub_freed_memory,
        "speculative": args.speculative, "num_speculative_tokens": args.num_speculative_tokens,
        "ngram_min": args.ngram_min, "ngram_max": args.ngram_max, "draft_layers": args.draft_layers,
    }


def register(sub: argparse._SubParsersAction) -> None:
    node = sub.add_parser("node", help="private node: the engine behind OHTTP, with attestation")
    add_node_args(node)
    node.set_defaults(handler=_node)
    up = sub.add_parser("up", help="all-in-one local deployment of the private path on loopback")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--capacities", default=None, help="comma-separated node capacities, e.g. 1,2")
    up.add_argument("--port", type=int, default=8000, help="port of the OpenAI-compatible proxy")
    up.add_argument("--state-dir", default=None,
                    help="where endpoints.json goes (default: a fresh temporary directory)")
    up.add_argument("--node-args", default="", help="extra options for every node, e.g. \"--dtype float32\"")
    up.set_defaults(handler=_up)


def node_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="traceless node")
    add_node_args(p)
    return p


# Python objects through glibc malloc; freed chunks overwritten (MALLOC_PERTURB_). glibc's per-thread
# cache keeps a few small freed chunks unscrubbed until reuse; disabling it (tcache_count=0) cost another
# ~6% of single-stream speed and audits found nothing it would have removed, so it stays on.
SCRUB_ENV = {"PYTHONMALLOC": "malloc", "MALLOC_PERTURB_": "165"}


def _reexec_with_scrubbing() -> None:
    """glibc reads MALLOC_PERTURB_ and Python reads PYTHONMALLOC at process start: start again
    with them set (same arguments). Every freed heap chunk is then overwritten, which is what
    removes the immutable Python strings of finished requests from memory (traceless audit residue)."""
    import os
    import sys

    if all(os.environ.get(k) == v for k, v in SCRUB_ENV.items()):
        return
    os.execve(sys.executable, [sys.executable, "-m", "traceless.cli", *sys.argv[1:]], {**os.environ, **SCRUB_ENV})


def _node(args: argparse.Namespace) -> int:
    import base64

    from traceless.cli.serve import build_async_engine, stream_shape
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn
    from traceless.node.app import create_node_app
    from traceless.node.identity import NodeIdentity
    from traceless.node.settings import NodeSettings
    from traceless.privacy.attestation.measurement import measure
    from traceless.privacy.attestation.software import SoftwareAttester
    from traceless.server.app import DEFAULT_MAX_BODY_BYTES

    if args.capacity < 1:
        raise SystemExit("traceless node: --capacity must be at least 1")
    if args.scrub_freed_memory:
        _reexec_with_scrubbing()
    configure_logging()
    engine = build_async_engine(args)
    measurement = measure(engine.model.path, node_measured_config(args))
    attester = SoftwareAttester()
    raw = attester.public_key.public_bytes_raw()
    # Public values, printed for the operator (and read by `traceless up`) -- not logs.
    print(f"attester-public-key: {base64.b64encode(raw).decode()}", flush=True)
    print(f"measurement: {measurement.combined.hex()}", flush=True)
    print(f"model: {args.served_model_name or engine.model_name}", flush=True)
    settings = NodeSettings(
        model_name=args.served_model_name or engine.model_name, capacity=args.capacity,
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES, attestation_ttl_s=args.attestation_ttl,
        gateway_url=args.gateway, public_url=args.public_url or f"http://{args.host}:{args.port}",
        register_interval_s=args.register_interval, stream_shape=stream_shape(args),
    )
    run_uvicorn(create_node_app(engine, NodeIdentity(attester, measurement), settings), args.host, args.port, "node")
    return 0


def _up(args: argparse.Namespace) -> int:
    from traceless.local.up import Deployment, UpOptions

    caps = [int(c) for c in args.capacities.split(",")] if args.capacities else [1] * args.nodes
    if len(caps) != args.nodes or min(caps) < 1 or args.nodes < 1:
        raise SystemExit("traceless up: --capacities must list one positive capacity per node")
    Deployment(UpOptions(caps, args.port, args.state_dir, args.node_args.split())).run()
    return 0
