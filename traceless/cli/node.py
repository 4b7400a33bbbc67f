"""`traceless node` and `traceless up` (argument parsing only)."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from traceless.cli.engine_args import add_engine_args
from traceless.cli.env import add_env_argument
from traceless.cli.hardening import make_undumpable
from traceless.cli.isolation import canonical_digest, reexec_isolated, require_isolated
from traceless.cli.limits import add_limit_args, connection_limits
from traceless.cli.scrubbing import SCRUB_ENV, add_scrub_arg
from traceless.cli.serve import add_http_args
from traceless.modes import choices
from traceless.privacy.shape import (
    DEFAULT_DECODE_MS_PER_TOKEN,
    DEFAULT_PREFILL_MS_PER_KIB,
    DEFAULT_TICK_MS,
    ShapePadding,
)

if TYPE_CHECKING:
    from traceless.privacy.attestation.software import Attester

MAX_GPUS = 8  # hardware.MAX_GPUS (not imported here: parser modules import nothing heavy)


def add_node_args(p: argparse.ArgumentParser) -> None:
    add_engine_args(p)
    add_http_args(p, 8100, 9100)
    add_limit_args(p)
    add_env_argument(p, "--gateway", "TRACELESS_GATEWAY_URL", help="gateway URL to register with")
    p.add_argument(
        "--capacity",
        type=int,
        default=1,
        help="routing weight, claimed in the node's attestation; must be one its logged release allows",
    )
    p.add_argument(
        "--log",
        default=None,
        help="transparency log URL: with it the node refuses to start unless "
        "its release is logged and allows --capacity",
    )
    p.add_argument("--log-public-key", default=None, help="the log's Ed25519 public key (base64), pinned")
    p.add_argument("--key-rotation", type=float, default=3600.0, help="seconds between OHTTP key rotations")
    p.add_argument(
        "--key-overlap",
        type=float,
        default=600.0,
        help="seconds a replaced OHTTP key is still accepted (longer than clients keep attestations)",
    )
    add_env_argument(
        p,
        "--public-url",
        "TRACELESS_PUBLIC_URL",
        help="URL the gateway reaches this node at (default http://HOST:PORT)",
    )
    p.add_argument("--register-interval", type=float, default=60.0, help="seconds between re-registrations")
    p.add_argument("--attestation-ttl", type=int, default=300, help="seconds an attestation document is valid")
    p.add_argument(
        "--attestation",
        choices=("software", "hardware"),
        default="software",
        help="hardware: a key born in this confidential VM, vouched for by SEV-SNP/TDX evidence from "
        "configfs-tsm (and --gpu-evidence GPUs' NVIDIA reports); software: an in-memory key that "
        "proves nothing about the code (development only; the default)",
    )
    p.add_argument(
        "--attester-key-file",
        default=None,
        metavar="PATH",
        help="with --attestation software: sign with the Ed25519 key kept in PATH (32 raw bytes, "
        "0600; created on first start), so clients that pin it accept the node after a restart. "
        "OHTTP keys stay in memory and are new at every start. Default: a new key every start",
    )
    p.add_argument(
        "--gpu-evidence",
        type=int,
        default=0,
        metavar="N",
        help=f"with --attestation hardware: NVIDIA confidential-computing evidence of GPUs 0..N-1 (0 to {MAX_GPUS})",
    )
    p.add_argument(
        "--evidence-ttl",
        type=int,
        default=3600,
        help="with --attestation hardware: seconds the base document its evidence binds is valid "
        "(evidence is collected again when the OHTTP keys change or the base nears expiry)",
    )
    p.add_argument(
        "--evidence-min-interval",
        type=float,
        default=60.0,
        help="with --attestation hardware: at most one evidence collection per this many seconds, "
        "whoever asks; meanwhile the node answers from the evidence it holds or refuses (503)",
    )
    g = p.add_argument_group("shape hiding (docs/shape-hiding.md)")
    g.add_argument(
        "--shape",
        choices=choices(ShapePadding),
        default=ShapePadding.BUCKETS.value,
        help="pad responses to size buckets and stream on a steady cadence (default), or send "
        "lengths and timings as they are (off: measurements only)",
    )
    g.add_argument(
        "--stream-tick",
        type=int,
        default=None,
        metavar="MS",
        help=f"with --shape buckets: one fixed-size stream chunk every MS milliseconds (default "
        f"{DEFAULT_TICK_MS}; 0 = a bucket-padded chunk per event, timings visible)",
    )
    g.add_argument(
        "--prefill-budget",
        type=int,
        default=None,
        metavar="MS",
        help=f"with a stream tick: a stream's first tick (its response head) comes no sooner than MS "
        f"milliseconds per KiB of the request's size bucket after the request arrived, so a "
        f"prompt's prefill time does not show (default {DEFAULT_PREFILL_MS_PER_KIB}; measured)",
    )
    g.add_argument(
        "--decode-budget",
        type=int,
        default=None,
        metavar="MS",
        help=f"with a stream tick: a stream whose request sets max_tokens runs for max_tokens x MS "
        f"milliseconds (padded after its last token), so the answer's length does not show; "
        f"without max_tokens, to a power-of-two number of ticks (default "
        f"{DEFAULT_DECODE_MS_PER_TOKEN}; measured)",
    )
    g.add_argument(
        "--ballast",
        choices=("on", "off"),
        default=None,
        help="with a stream tick: while a stream is open and no request runs, the engine decodes for "
        "no one (its outputs dropped), so its load, which slows the stream's timer, does not end "
        "with the answer (default on; off saves that compute and lets the timer's jitter show "
        "the answer's length; measured)",
    )
    add_scrub_arg(p)


def shape_policy(args: argparse.Namespace):
    """The node's shape settings, checked: a flag its mode cannot apply is refused, never ignored."""
    from traceless.privacy.shape import ShapePolicy

    _refuse_inapplicable_shape_flags(args)
    tick = DEFAULT_TICK_MS if args.stream_tick is None else args.stream_tick
    prefill = DEFAULT_PREFILL_MS_PER_KIB if args.prefill_budget is None else args.prefill_budget
    decode = DEFAULT_DECODE_MS_PER_TOKEN if args.decode_budget is None else args.decode_budget
    try:
        return ShapePolicy(args.shape, tick, prefill, decode, ballast=args.ballast != "off")
    except ValueError as exc:
        raise SystemExit(f"traceless node: {exc}") from None


def _refuse_inapplicable_shape_flags(args: argparse.Namespace) -> None:
    # With --shape buckets every size the hops see is already fixed (whole responses and untimed
    # chunks in size buckets, timed chunks all one size): per-event padding would only cost bytes.
    if args.stream_padding and args.shape != ShapePadding.OFF.value:
        raise SystemExit(
            "traceless node: --stream-padding applies with --shape off only: with --shape buckets "
            "every response and chunk already has a size from the bucket table"
        )
    timing = {
        "--stream-tick": args.stream_tick,
        "--prefill-budget": args.prefill_budget,
        "--decode-budget": args.decode_budget,
        "--ballast": args.ballast,
    }
    for flag, value in timing.items():
        if value is not None and args.shape == ShapePadding.OFF.value:
            raise SystemExit(
                f"traceless node: {flag} applies with --shape buckets only (--shape off sends chunks as they come)"
            )
        if value is not None and flag != "--stream-tick" and args.stream_tick == 0:
            raise SystemExit(
                f"traceless node: {flag} applies with a stream tick only (--stream-tick 0 sends chunks as they come)"
            )


def node_measured_config(args: argparse.Namespace) -> dict:
    """The node configuration that goes into its measurement: everything that changes what the
    node does with a request. Placement and sizing (host, port, memory, capacity) are left out,
    so one logged release covers every deployment of it."""
    return {
        "component": "node",
        "dtype": args.dtype,
        "quantization": args.quantization,
        "block_size": args.block_size,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_queued_requests": args.max_queued_requests,
        "attention_backend": args.attention_backend,
        "served_model_name": args.served_model_name,
        "attestation_ttl": args.attestation_ttl,
        "prefix_cache": args.prefix_cache,
        "prefix_cache_ttl": args.prefix_cache_ttl,
        "public_prefixes": [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in args.public_prefix],
        "stream_padding": args.stream_padding,
        "stream_interval": args.stream_interval,
        "kv_offload": args.kv_offload,
        "kv_cache_dtype": args.kv_cache_dtype,
        "scrub_freed_memory": args.scrub_freed_memory,
        # the isolated environment it runs in (cli/isolation.py): a node started otherwise refuses
        "environment": canonical_digest(SCRUB_ENV if args.scrub_freed_memory else {}),
        "request_events": args.request_events,
        "metrics_window": args.metrics_window,
        "metrics_min_requests": args.metrics_min_requests,
        "metrics_epsilon": args.metrics_epsilon,
        "speculative": args.speculative,
        "num_speculative_tokens": args.num_speculative_tokens,
        "ngram_min": args.ngram_min,
        "ngram_max": args.ngram_max,
        "draft_layers": args.draft_layers,
        "load_format": args.load_format,
        **shape_policy(args).measured(),
        "chat_template": (
            None if args.chat_template is None else hashlib.sha256(Path(args.chat_template).read_bytes()).hexdigest()
        ),
        # What a client may conclude from a document depends on who signs it and with which evidence.
        "attestation": args.attestation,
        "gpu_evidence": args.gpu_evidence,
    }


def build_attester(args: argparse.Namespace, *, tsm_root: Path | None = None, nvml: object = None) -> Attester:
    """The node's attester. `hardware` collects evidence once at start (probe), so a machine without the
    confidential VM, the GPU or its CC mode fails here, before the model loads, with SystemExit
    naming what is missing. `tsm_root` and `nvml` replace the real configfs path and pynvml (tests)."""
    from traceless.privacy.attestation.collectors import CollectorError
    from traceless.privacy.attestation.hardware import HardwareAttester
    from traceless.privacy.attestation.nvml import NvmlCollector
    from traceless.privacy.attestation.software import SoftwareAttester
    from traceless.privacy.attestation.tsm import TSM_REPORT_ROOT, TsmCollector

    if not 0 <= args.gpu_evidence <= MAX_GPUS:
        raise SystemExit(f"traceless node: --gpu-evidence must be 0 to {MAX_GPUS}")
    if args.attestation == "software":
        if args.gpu_evidence:
            raise SystemExit("traceless node: --gpu-evidence needs --attestation hardware")
        if args.attester_key_file is None:
            return SoftwareAttester()
        from traceless.node.attester_key import AttesterKeyFileError, load_or_create

        try:
            return SoftwareAttester(load_or_create(args.attester_key_file))
        except (AttesterKeyFileError, OSError) as exc:
            raise SystemExit(f"traceless node: --attester-key-file {args.attester_key_file}: {exc}") from None
    if args.attester_key_file is not None:
        raise SystemExit(
            "traceless node: --attester-key-file is for --attestation software: a hardware "
            "attester's key is born in the confidential VM at every start and never kept"
        )
    gpus = [NvmlCollector(i, nvml=nvml) for i in range(args.gpu_evidence)]
    attester = HardwareAttester(TsmCollector(tsm_root or TSM_REPORT_ROOT), gpus)
    try:
        attester.probe()
    except CollectorError as e:
        raise SystemExit(
            f"traceless node: --attestation hardware cannot collect evidence on this machine: {e}"
        ) from None
    return attester


def register(sub: argparse._SubParsersAction) -> None:
    node = sub.add_parser("node", help="private node: the engine behind OHTTP, with attestation")
    add_node_args(node)
    node.set_defaults(handler=_node, check=_node_check)


def node_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="traceless node")
    add_node_args(p)
    return p


def _node_check(args: argparse.Namespace) -> None:
    """What must hold before anything starts (SystemExit otherwise)."""
    from traceless.cli.serve import shutdown_policy, window_policy
    from traceless.node.evidence_cache import EvidenceLimits

    if args.capacity < 1:
        raise SystemExit("traceless node: --capacity must be at least 1")
    window_policy(args, "node")  # a bad telemetry, shape or shutdown setting fails before the model loads
    shape_policy(args)
    shutdown_policy(args, None, "node")
    if bool(args.log) != bool(args.log_public_key):
        raise SystemExit("traceless node: --log and --log-public-key go together")
    try:
        EvidenceLimits(args.evidence_ttl, args.evidence_min_interval)
    except ValueError as exc:
        raise SystemExit(f"traceless node: {exc}") from None


def _node(args: argparse.Namespace) -> int:
    import base64

    from traceless.cli.serve import (
        ENGINE_STOPPED_EXIT,
        build_async_engine,
        exit_when_engine_stops,
        reserve_ports,
        shutdown_policy,
        stream_shape,
        telemetry_for,
    )
    from traceless.events import configure_logging
    from traceless.http.serve import run_uvicorn
    from traceless.node.app import create_node_app
    from traceless.node.evidence_cache import EvidenceLimits
    from traceless.node.identity import NodeIdentity
    from traceless.node.keyring import KeyRing
    from traceless.node.settings import NodeSettings
    from traceless.privacy.attestation.measurement import measure
    from traceless.server.app import DEFAULT_MAX_BODY_BYTES

    _node_check(args)
    limits = EvidenceLimits(args.evidence_ttl, args.evidence_min_interval)  # checked by _node_check
    attester = build_attester(args)  # before the model loads: no device, no start
    scrub_env = SCRUB_ENV if args.scrub_freed_memory else {}
    reexec_isolated(scrub_env)  # no PYTHONPATH, LD_PRELOAD, site-customize: what runs is what is measured
    require_isolated(scrub_env)
    make_undumpable()  # before any request: no core file, no ptrace by the same user
    configure_logging()
    public, operator_sock = reserve_ports(args, "node")
    engine = build_async_engine(args)
    measurement = measure(engine.model.path, node_measured_config(args))
    if args.log:
        check_release_allows(args.log, args.log_public_key, measurement.combined, args.capacity)
    raw = attester.public_key.public_bytes_raw()
    # Public values, printed for the operator (and read by `traceless up`) -- not logs.
    print(f"attester-public-key: {base64.b64encode(raw).decode()}", flush=True)
    print(f"measurement: {measurement.combined.hex()}", flush=True)
    print(f"model: {args.served_model_name or engine.model_name}", flush=True)
    print(f"attestation: {attester.attester_type}", flush=True)
    public_url = (args.public_url or f"http://{args.host}:{args.port}").rstrip("/")
    settings = NodeSettings(
        model_name=args.served_model_name or engine.model_name,
        capacity=args.capacity,
        max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES,
        attestation_ttl_s=args.attestation_ttl,
        gateway_url=args.gateway,
        public_url=public_url,
        register_interval_s=args.register_interval,
        stream_shape=stream_shape(args),
        shape=shape_policy(args),
        request_events=args.request_events,
    )
    identity = NodeIdentity(
        attester,
        measurement,
        capacity=args.capacity,
        node_url=public_url,
        keys=KeyRing(args.key_rotation, args.key_overlap),
        evidence_limits=limits,
    )
    telemetry, operator = telemetry_for(args, engine, "node", operator_sock)
    exit_when_engine_stops(engine, "node")
    run_uvicorn(
        create_node_app(engine, identity, settings, telemetry),
        args.host,
        args.port,
        "node",
        operator=operator,
        limits=connection_limits(args),
        sock=public,
        shutdown=shutdown_policy(args, engine, "node"),
    )
    return ENGINE_STOPPED_EXIT if engine.dead else 0


def check_release_allows(log_url: str, log_public_key: str, combined: bytes, capacity: int) -> None:
    """Fail fast (SystemExit naming the rule) unless the log holds this release and it allows `capacity`."""
    import base64

    from traceless.privacy.translog.client import LogClient, LogClientError
    from traceless.privacy.translog.release_index import ReleaseIndex, ReleaseNotLoggedError

    with LogClient(log_url, base64.b64decode(log_public_key)) as log:
        try:
            release = ReleaseIndex(log).release_for(combined)
        except ReleaseNotLoggedError:
            raise SystemExit(
                "traceless node: this node's measurement is not a release in the transparency log"
            ) from None
        except LogClientError as exc:
            raise SystemExit(f"traceless node: the transparency log could not be read or verified ({exc})") from None
    if not release.allows_capacity(capacity):
        allowed = ", ".join(str(c) for c in release.capacities)
        raise SystemExit(
            f"traceless node: --capacity {capacity} is not allowed by the logged release (it allows: {allowed})"
        )
