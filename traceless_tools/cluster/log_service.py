"""Read-only HTTP service of the transparency log (RFC 6962 / 9162 style endpoints).

    GET /log/v1/sth                                   latest signed tree head
    GET /log/v1/public-key                            the log's Ed25519 public key (raw, base64)
    GET /log/v1/proof/inclusion?leaf_hash=&tree_size= inclusion proof (leaf_hash base64 or hex)
    GET /log/v1/proof/consistency?first=&second=      consistency proof between two tree sizes
    GET /log/v1/entries?start=&end=                   leaf_inputs start..end, inclusive, capped
    GET /log/v1/sth/cosigned                          {"sth": ..., "cosignatures": [...]}: the latest
                                                      head with the witnesses' cosignatures of it
    POST /log/v1/cosignature                          {"sth": ..., "cosignature": ...}: a witness
                                                      hands in its cosignature of the current head

Binary values are base64. Appending is not offered over HTTP: it is a local admin operation
(`traceless log append`) on the log directory, which this service picks up on the next request.
Cosignatures are accepted only from the witness keys the service is started with, only for the
current tree head, and only if they verify; they are kept in memory (a witness hands in a fresh
one on every poll, so a restart loses nothing for long). See traceless/privacy/translog/cosignature.py.
Errors are OpenAI-shaped JSON (traceless/http: 400 bad parameter, 404 unknown leaf, 503 log
directory unreadable); messages describe the parameter, never echo its value.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from traceless.errors import InvalidRequestError
from traceless.events import emit
from traceless.http.app import create_app as create_http_app
from traceless.http.app import endpoint
from traceless.http.body import parse_json
from traceless.http.errors import ApiError
from traceless.http.serve import uvicorn_config
from traceless.privacy.translog.cosignature import Cosignature, CosignatureError
from traceless.privacy.translog.log import LeafNotFoundError, LogCorruptError, TransparencyLog
from traceless.privacy.translog.merkle import HASH_SIZE, TreeSizeError
from traceless.privacy.translog.tree_head import SignedTreeHead, TreeHeadError

COMPONENT = "log"
MAX_ENTRIES_PER_REQUEST = 1000
MAX_COSIGNATURE_BODY = 4096
_UINT = re.compile(r"[0-9]{1,19}")
_HEX_HASH = re.compile(r"[0-9a-fA-F]{64}")
_URLSAFE_TO_STD = str.maketrans("-_", "+/")

Handler = Callable[[Request, TransparencyLog], dict[str, object]]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _uint(request: Request, name: str) -> int:
    raw = request.query_params.get(name)
    if raw is None or not _UINT.fullmatch(raw) or int(raw) >= 2**63:
        raise InvalidRequestError(f"query parameter '{name}' must be a non-negative integer")
    return int(raw)


def _leaf_hash(request: Request) -> bytes:
    raw = request.query_params.get("leaf_hash", "")
    if _HEX_HASH.fullmatch(raw):  # checked first: 64 hex digits are also valid base64
        return bytes.fromhex(raw)
    # Standard or URL-safe base64; an unencoded '+' in a query string arrives as a space.
    raw = raw.replace(" ", "+").translate(_URLSAFE_TO_STD)
    try:
        value = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        value = b""
    if len(value) != HASH_SIZE:
        raise InvalidRequestError("query parameter 'leaf_hash' must be a 32-byte hash in base64 or hex")
    return value


def _sth(request: Request, log: TransparencyLog) -> dict[str, object]:
    return log.sth.to_json()


def _public_key(request: Request, log: TransparencyLog) -> dict[str, object]:
    return {"public_key": _b64(log.public_key_bytes()), "key_type": "ed25519"}


def _inclusion(request: Request, log: TransparencyLog) -> dict[str, object]:
    leaf_hash, tree_size = _leaf_hash(request), _uint(request, "tree_size")
    if not 1 <= tree_size <= log.tree_size:
        raise InvalidRequestError("tree_size must be between 1 and the current tree size")
    proof = log.inclusion_proof(leaf_hash, tree_size)
    return {
        "leaf_index": proof.leaf_index,
        "tree_size": proof.tree_size,
        "inclusion_path": [_b64(p) for p in proof.inclusion_path],
    }


def _consistency(request: Request, log: TransparencyLog) -> dict[str, object]:
    first, second = _uint(request, "first"), _uint(request, "second")
    if not 0 < first <= second <= log.tree_size:
        raise InvalidRequestError("need 0 < first <= second <= the current tree size")
    return {"consistency_path": [_b64(p) for p in log.consistency_proof(first, second)]}


def _entries(request: Request, log: TransparencyLog) -> dict[str, object]:
    start, end = _uint(request, "start"), _uint(request, "end")
    if not start <= end or start >= log.tree_size:
        raise InvalidRequestError("need start <= end and start below the current tree size")
    # Like RFC 6962 get-entries, answer a prefix of the range: up to the cap and the tree size.
    end = min(end, log.tree_size - 1, start + MAX_ENTRIES_PER_REQUEST - 1)
    return {"entries": [{"leaf_input": _b64(x)} for x in log.get_entries(start, end)]}


class Cosignatures:
    """The latest cosignature of each configured witness for the log's current tree head."""

    def __init__(self, log: TransparencyLog, witness_keys: tuple[bytes, ...]) -> None:
        self._log = log
        self._keys = frozenset(witness_keys)
        self._sth: SignedTreeHead | None = None
        self._by_witness: dict[bytes, Cosignature] = {}

    def current(self) -> list[Cosignature]:
        if self._sth != self._log.sth:  # a new head: the old cosignatures are not of it
            self._sth, self._by_witness = self._log.sth, {}
        return list(self._by_witness.values())

    def add(self, sth: SignedTreeHead, cosignature: Cosignature) -> None:
        self.current()
        if cosignature.witness_key not in self._keys:
            raise ApiError(
                403,
                "this log does not take cosignatures from that witness key",
                type="permission_error",
                code="unknown_witness",
            )
        if sth != self._sth:
            raise ApiError(409, "the cosigned tree head is not the log's current one", code="stale_tree_head")
        try:
            cosignature.verify(self._log.public_key_bytes(), sth)
        except CosignatureError:
            raise ApiError(400, "the cosignature does not verify", code="bad_cosignature") from None
        old = self._by_witness.get(cosignature.witness_key)
        if old is None or cosignature.timestamp >= old.timestamp:
            self._by_witness[cosignature.witness_key] = cosignature


def _cosigned(cosigs: Cosignatures) -> Handler:
    def handler(request: Request, log: TransparencyLog) -> dict[str, object]:
        return {"sth": log.sth.to_json(), "cosignatures": [c.to_json() for c in cosigs.current()]}

    return handler


def _cosignature_endpoint(log: TransparencyLog, cosigs: Cosignatures) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> JSONResponse:
        body = await request.body()
        if len(body) > MAX_COSIGNATURE_BODY:
            raise ApiError(413, "request body too large", code="too_large")
        obj = parse_json(body)
        try:
            sth, cosig = SignedTreeHead.from_json(obj["sth"]), Cosignature.from_json(obj["cosignature"])
        except (ValueError, TypeError, KeyError, TreeHeadError, CosignatureError):
            raise ApiError(
                400, 'body must be {"sth": tree head, "cosignature": cosignature}', code="invalid_parameter"
            ) from None
        try:
            log.refresh()
        except LogCorruptError:
            raise ApiError(
                503, "the log directory failed validation", type="server_error", code="log_unavailable"
            ) from None
        cosigs.add(sth, cosig)
        emit("log.cosignature_accepted", tree_size=sth.tree_size)
        return JSONResponse({"accepted": True})

    return endpoint(COMPONENT, "log", run)


def _endpoint(handler: Handler, log: TransparencyLog) -> Callable[[Request], Awaitable[Response]]:
    # Async and without awaits inside: requests run one at a time on the event loop, so the
    # (not thread-safe) log object is never used concurrently.
    async def run(request: Request) -> JSONResponse:
        try:
            log.refresh()
            return JSONResponse(handler(request, log))
        except (InvalidRequestError, TreeSizeError) as e:
            raise ApiError(400, str(e), code="invalid_parameter") from None
        except LeafNotFoundError:
            raise ApiError(
                404, "no leaf with this hash in the requested tree", type="not_found_error", code="leaf_not_found"
            ) from None
        except LogCorruptError:
            raise ApiError(
                503, "the log directory failed validation", type="server_error", code="log_unavailable"
            ) from None

    return endpoint(COMPONENT, "log", run)


def create_app(log: TransparencyLog, witness_keys: tuple[bytes, ...] = ()) -> Starlette:
    cosigs = Cosignatures(log, witness_keys)
    routes = [
        Route("/log/v1/sth", _endpoint(_sth, log)),
        Route("/log/v1/sth/cosigned", _endpoint(_cosigned(cosigs), log)),
        Route("/log/v1/cosignature", _cosignature_endpoint(log, cosigs), methods=["POST"]),
        Route("/log/v1/public-key", _endpoint(_public_key, log)),
        Route("/log/v1/proof/inclusion", _endpoint(_inclusion, log)),
        Route("/log/v1/proof/consistency", _endpoint(_consistency, log)),
        Route("/log/v1/entries", _endpoint(_entries, log)),
    ]
    return create_http_app(COMPONENT, routes)


def build_server(
    log_dir: str | Path, host: str = "127.0.0.1", port: int = 8090, witness_keys: tuple[bytes, ...] = ()
) -> uvicorn.Server:
    """A uvicorn server for the log at `log_dir` (opened and validated now)."""
    app = create_app(TransparencyLog.open(log_dir), witness_keys)
    return uvicorn.Server(uvicorn_config(app, host=host, port=port))


def serve(log_dir: str | Path, host: str = "127.0.0.1", port: int = 8090, witness_keys: tuple[bytes, ...] = ()) -> None:
    """Run the log service until interrupted."""
    server = build_server(log_dir, host, port, witness_keys)
    emit("service.started", component=COMPONENT, port=port)
    try:
        server.run()
    finally:
        emit("service.stopped", component=COMPONENT)
