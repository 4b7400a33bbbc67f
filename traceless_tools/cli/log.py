"""Commands `traceless log {serve,append,verify,witness}` (`traceless measure` is the core's).

Module-level imports stay light (the CLI imports every command module to build its parser);
each handler imports what it needs.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import re
import sys
from pathlib import Path

from traceless.cli.env import add_env_argument

_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")


class CommandError(Exception):
    """A failure the command reports as one line on stderr with exit status 1."""


def register(subparsers: argparse._SubParsersAction) -> None:

    log = subparsers.add_parser("log", help="transparency log of release measurements")
    actions = log.add_subparsers(dest="log_command", metavar="ACTION", required=True)
    serve = actions.add_parser("serve", help="serve a log directory over HTTP (read only)")
    add_env_argument(serve, "--dir", "TRACELESS_LOG_DIR", type=Path, required=True)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8090, help="port to listen on")
    serve.add_argument(
        "--witness-key",
        action="append",
        default=[],
        help="Ed25519 public key (base64) of a witness whose cosignatures the log takes and serves; repeatable",
    )
    serve.set_defaults(handler=_run(_serve))
    append = actions.add_parser("append", help="append one leaf to a log directory (created if absent)")
    add_env_argument(append, "--dir", "TRACELESS_LOG_DIR", type=Path, required=True)
    append.add_argument(
        "--if-absent",
        action="store_true",
        help="succeed without appending when the leaf is already in the log (a deployment "
        "publishes its release at every start)",
    )
    append.add_argument(
        "leaf", metavar="HEX_OR_FILE", help="a hex measurement, or a file whose contents become one leaf"
    )
    append.set_defaults(handler=_run(_append))
    verify = actions.add_parser("verify", help="audit a log: all entries, root, consistency with --state")
    verify.add_argument("--url", required=True, help="base URL of the log service")
    verify.add_argument("--state", type=Path, help="JSON file with the last verified tree head (updated)")
    verify.add_argument("--public-key", help="the log's Ed25519 public key, raw, base64 (pinned)")
    verify.set_defaults(handler=_run(_verify))
    witness = actions.add_parser(
        "witness", help="run an independent witness: cosign the log's tree heads that extend the last one it cosigned"
    )
    add_env_argument(witness, "--log", "TRACELESS_LOG_URL", required=True, help="base URL of the log service")
    add_env_argument(
        witness,
        "--log-public-key",
        "TRACELESS_LOG_PUBLIC_KEY",
        required=True,
        help="the log's Ed25519 public key (base64), pinned",
    )
    witness.add_argument(
        "--dir",
        type=Path,
        required=True,
        help="the witness's directory: its key and the last head it cosigned (kept 0600)",
    )
    witness.add_argument(
        "--interval",
        type=float,
        default=60.0,
        help="seconds between polls; each poll re-cosigns the current head (default 60)",
    )
    witness.set_defaults(handler=_run(_witness))


def _run(handler):
    def run(args: argparse.Namespace) -> int:
        from traceless.errors import TracelessError

        try:
            return handler(args)
        except (CommandError, TracelessError, OSError) as e:
            print(f"traceless: error: {e}", file=sys.stderr)
            return 1

    return run


def _serve(args: argparse.Namespace) -> int:
    from traceless.events import configure_logging
    from traceless_tools.cluster.log_service import serve

    configure_logging()
    try:
        serve(args.dir, args.host, args.port, tuple(_ed25519_key(k, "--witness-key") for k in args.witness_key))
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        pass
    return 0


def _ed25519_key(value: str, flag: str) -> bytes:
    try:
        key = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != 32:
        raise CommandError(f"{flag} must be a 32-byte Ed25519 key in base64")
    return key


def _witness(args: argparse.Namespace) -> int:
    from traceless.events import configure_logging, emit
    from traceless.privacy.translog.witness import Witness
    from traceless_tools.cluster.witness_service import run

    if args.interval <= 0:
        raise CommandError("--interval must be positive")
    configure_logging()
    witness = Witness(args.dir, _ed25519_key(args.log_public_key, "--log-public-key"))
    print(f"witness-public-key: {witness.public_key_b64()}", flush=True)
    emit("service.started", component="witness", port=0)
    try:
        run(witness, args.log, args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        emit("service.stopped", component="witness")
    return 0


def _leaf_input(arg: str) -> bytes:
    path = Path(arg)
    if path.is_file():
        return path.read_bytes()
    if _HEX.fullmatch(arg):
        return bytes.fromhex(arg)
    raise CommandError("HEX_OR_FILE is neither an existing file nor an even number of hex digits")


def _append(args: argparse.Namespace) -> int:
    from traceless.privacy.translog.log import DuplicateLeafError, LogNotFoundError, TransparencyLog

    leaf = _leaf_input(args.leaf)
    try:
        log, created = TransparencyLog.open(args.dir), False
    except LogNotFoundError:
        log, created = TransparencyLog.create(args.dir), True
    if created:
        print(f"created a new log; public_key {base64.b64encode(log.public_key_bytes()).decode()}")
    try:
        result = log.append(leaf)
    except DuplicateLeafError:
        if not args.if_absent:
            raise
        print(f"already in the log; tree_size {log.tree_size}")
        return 0
    print(f"tree_size {result.sth.tree_size}")
    print(f"leaf_index {result.leaf_index}")
    print(f"leaf_hash {result.leaf_hash.hex()}")
    print(f"root_hash {result.sth.root_hash.hex()}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from traceless.privacy.translog.client import LogClientError, verify_log

    key = None
    if args.public_key is not None:
        try:
            key = base64.b64decode(args.public_key, validate=True)
        except (binascii.Error, ValueError):
            key = b""
        if len(key) != 32:
            raise CommandError("--public-key must be a 32-byte Ed25519 key in base64")
    try:
        result = verify_log(args.url, args.state, key)
    except LogClientError as e:
        print(f"traceless: log verification FAILED: {e}", file=sys.stderr)
        return 1
    sth = result.sth
    print(f"ok: tree_size {sth.tree_size} root_hash {sth.root_hash.hex()} (signature, entries and root verified)")
    if result.previous_size is not None:
        print(f"consistent with the tree head seen before (tree_size {result.previous_size})")
    elif args.state is not None:
        print(
            f"first use: saved state; pinned public_key {base64.b64encode(result.public_key).decode()}"
            " (compare it out of band)"
        )
    else:
        print("no --state given: consistency with earlier tree heads not checked")
    return 0
