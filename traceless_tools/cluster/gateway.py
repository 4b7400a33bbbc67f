"""The gateway (`traceless gateway`): untrusted load balancer of the private path.

    POST /pcc/v1/register          node -> {"node_id"}              (admission.py, registry.py)
    GET  /pcc/v1/nodes?model&k[&nonce]
                                   K capacity-weighted candidates (routing.py); with a client's
                                   nonce (and a token, spent: the nodes sign for it), each with a
                                   document its node made for that nonce now, signed by the key
                                   its hardware evidence vouches for, the evidence and the base
                                   document it binds (health.py), and only the nodes that could;
                                   at most MAX_LISTING_BYTES of them
    GET  /pcc/v1/challenge         WWW-Authenticate: PrivateToken ...
    POST /pcc/v1/ohttp/{node_id}   token check (on the head), then the body streamed to
                                   {node}/pcc/v1/ohttp and the node's response streamed back

What it sees: ciphertext, a token, a model name. It cannot decrypt (it holds no OHTTP key)
and cannot tell who sent a request (the relay hides the address; tokens are unlinkable to
their issuance). Routing gets the model, the nodes' capacity and health, and randomness, and
nothing from the request. To a node it forwards the body and its content-type, nothing else.
Capacities are what the nodes' attestations claim and their logged release allows; the
listing carries none of the gateway's own: clients read capacity from the documents and draw
their node themselves.
"""

from __future__ import annotations

import asyncio
import random
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from traceless.errors import InvalidRequestError
from traceless.events import emit
from traceless.http.app import create_app, endpoint
from traceless.http.body import parse_json, read_body, require_media_type, stream_body
from traceless.http.errors import ApiError
from traceless.http.upstream import Cuts, UpstreamStream, upstream_client, upstream_error
from traceless.privacy.attestation.evidence_policy import AttestationPolicy
from traceless.privacy.attestation.policy import CLOCK_LEEWAY_S, AttesterPolicy
from traceless.privacy.attestation.software import NONCE_MAX, NONCE_MIN
from traceless.privacy.ohttp.media import REQUEST_MEDIA_TYPES
from traceless.privacy.privacypass.errors import DoubleSpendError, SpentSetFullError, TokenRejectedError
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.redemption_schedule import RedemptionSchedule
from traceless.privacy.privacypass.verifier import CheckedToken, Verifier
from traceless.privacy.translog.release_index import ReleaseLookup
from traceless_tools.cluster.admission import AdmissionPolicy, admit, parse_attester_key
from traceless_tools.cluster.health import fresh_attestation, health_loop
from traceless_tools.cluster.issuer_directory import DIRECTORY_PATH, IssuerDirectoryError, issuer_name, parse_directory
from traceless_tools.cluster.registry import NodeRegistration, NodeRegistry, RegistryFullError, StaleRegistrationError
from traceless_tools.cluster.routing import NoNodeAvailableError, choose_nodes

COMPONENT = "gateway"
# A registration carries up to MAX_EVIDENCE_ITEMS hardware reports with their certificates (a few
# KiB each in practice, MAX_EVIDENCE_FIELD at most per field).
MAX_REGISTRATION_BYTES = 2 * 2**20
MAX_K = 1000
# The candidate listing stops adding nodes past this many bytes of documents, keys and evidence
# (one node's bounded evidence always fits), so k=1000 nodes with GPU evidence stays a bounded reply.
MAX_LISTING_BYTES = 8 * 2**20
_UINT = re.compile(r"[0-9]{1,6}")
_HEX = re.compile(r"[0-9a-fA-F]*")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Gateway settings. `privacy=False` skips the token check (benchmarks only). The attester
    policy is PRODUCTION unless a deployment says DEVELOPMENT (which trusts software attester keys
    on proof of possession, or only `trusted_attester_keys` when that is set)."""

    issuer_url: str | None = None
    privacy: bool = True
    register_secret: str | None = field(default=None, repr=False)
    health_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    unhealthy_after: int = 3
    max_body_bytes: int = 8 * 2**20
    default_k: int = 3
    challenge_epoch_s: float = 3600.0
    challenge_grace_s: float = 300.0
    max_spent_entries: int = 1_000_000
    node_read_timeout_s: float = 600.0
    attester_policy: AttesterPolicy = AttesterPolicy.PRODUCTION
    trusted_attester_keys: tuple[bytes, ...] = ()
    max_nodes: int = 1024
    registration_max_age_s: float = 600.0
    # With an evidence policy, a node is admitted on hardware evidence that vouches for its key
    # (and the software attester only if that policy allows it); see admission.py.
    evidence_policy: AttestationPolicy | None = None
    issuer_refresh_s: float = 60.0  # how often the issuer's directory is read again (key rotation, restart)

    @property
    def admission(self) -> AdmissionPolicy:
        return AdmissionPolicy(
            self.attester_policy,
            self.trusted_attester_keys,
            self.registration_max_age_s,
            CLOCK_LEEWAY_S,
            self.evidence_policy,
        )

    def __post_init__(self) -> None:
        if not (self.health_interval_s > 0 and self.health_timeout_s > 0):
            raise ValueError("health interval and timeout must be positive")
        if self.unhealthy_after < 1 or self.default_k < 1 or self.max_body_bytes < 1:
            raise ValueError("unhealthy_after, default_k and max_body_bytes must be positive")
        if self.privacy and not self.issuer_url:
            raise ValueError("the token check needs the issuer's URL")
        if self.max_nodes < 1 or not self.registration_max_age_s > 0 or not self.issuer_refresh_s > 0:
            raise ValueError("max_nodes, registration_max_age_s and issuer_refresh_s must be positive")


def build_verifier(
    config: GatewayConfig, issuer_keys: Sequence[IssuerPublicKey], clock: Callable[[], float]
) -> Verifier:
    """One verifier serves both the challenge route and the token check, so the challenge a
    client is given is by construction one the check accepts. origin_info is empty: the
    epoch's public challenge is the same for every client, who derives it and compares (one
    challenge for everyone); a client clock up to CLOCK_LEEWAY_S ahead is accepted early."""
    name = issuer_name(config.issuer_url) if config.issuer_url else "traceless-issuer"
    schedule = RedemptionSchedule(
        name,
        "",
        config.challenge_epoch_s,
        config.challenge_grace_s,
        min(float(CLOCK_LEEWAY_S), config.challenge_epoch_s),
    )
    return Verifier(issuer_keys, schedule, max_spent_entries=config.max_spent_entries, clock=clock)


def _token_required(verifier: Verifier, message: str, code: str) -> ApiError:
    return ApiError(
        401, message, type="authentication_error", code=code, headers={"WWW-Authenticate": verifier.www_authenticate()}
    )


def _nonce(request: Request) -> bytes | None:
    raw = request.query_params.get("nonce")
    if raw is None:
        return None
    if not _HEX.fullmatch(raw) or len(raw) % 2 or not NONCE_MIN <= len(raw) // 2 <= NONCE_MAX:
        raise ApiError(
            400, f"nonce must be {NONCE_MIN} to {NONCE_MAX} bytes in hex", param="nonce", code="invalid_parameter"
        )
    return bytes.fromhex(raw)


def _k(request: Request, default: int) -> int:
    raw = request.query_params.get("k")
    if raw is None:
        return default
    if not _UINT.fullmatch(raw) or not 1 <= int(raw) <= MAX_K:
        raise ApiError(400, f"k must be an integer in 1..{MAX_K}", param="k", code="invalid_parameter")
    return int(raw)


class Gateway:
    """The route handlers; `registry` and `verifier` are public so tests can inspect them."""

    def __init__(
        self, config: GatewayConfig, verifier: Verifier | None, releases: ReleaseLookup, rng: random.Random
    ) -> None:
        self.config = config
        self.verifier = verifier
        self.registry = NodeRegistry(config.unhealthy_after, config.max_nodes)
        self._releases = releases
        self._rng = rng
        self._client: httpx.AsyncClient | None = None  # opened by the app's lifespan
        self.cuts = Cuts()  # calls in flight to each node, cut when the node is dropped

    @asynccontextmanager
    async def lifespan(self, app: Starlette):
        self._client = upstream_client(self.config.node_read_timeout_s)
        checks = asyncio.create_task(
            health_loop(
                self.registry,
                self._client,
                self.config.health_interval_s,
                self.config.health_timeout_s,
                self.config.admission,
                self._dropped,
            )
        )
        keys = asyncio.create_task(self._issuer_key_loop())
        try:
            yield
        finally:
            checks.cancel()
            keys.cancel()
            await asyncio.gather(checks, keys, return_exceptions=True)
            await self._client.aclose()

    def _dropped(self, node_id: str) -> None:
        """A node failed its health checks: it may be gone without a word (no FIN, no RST), so the
        calls still waiting on it are cut now rather than left to their read timeout."""
        cut = self.cuts.cut(node_id)
        if cut:
            emit("gateway.streams_cut", streams=cut)

    async def _issuer_key_loop(self) -> None:
        """Read the issuer's directory every issuer_refresh_s and take its keys (rotation without restarts)."""
        if self.verifier is None or not self.config.issuer_url:
            return
        while True:
            await asyncio.sleep(self.config.issuer_refresh_s)
            await self.refresh_issuer_keys()

    async def refresh_issuer_keys(self) -> None:
        if self.verifier is None or not self.config.issuer_url or self._client is None:
            return
        try:
            r = await self._client.get(self.config.issuer_url.rstrip("/") + DIRECTORY_PATH, timeout=10.0)
            keys = parse_directory(r.json()) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, IssuerDirectoryError):
            keys = None
        if keys is None:  # keep the keys we have: tokens under them still verify
            emit("gateway.issuer_keys", ok=False, changed=False, keys=0)
            return
        changed = self.verifier.update_issuer_keys(keys)
        emit("gateway.issuer_keys", ok=True, changed=changed, keys=len(keys))

    async def register(self, request: Request) -> Response:
        secret = self.config.register_secret
        if secret is not None and not secrets.compare_digest(
            request.headers.get("authorization", "").encode(), f"Bearer {secret}".encode()
        ):
            raise ApiError(
                401,
                "registration needs the gateway's register secret",
                type="authentication_error",
                code="invalid_register_secret",
            )
        require_media_type(request, ("application/json",))
        body = await read_body(request, MAX_REGISTRATION_BYTES)
        try:
            registration = NodeRegistration.from_json(parse_json(body))
        except InvalidRequestError as exc:
            raise ApiError(400, str(exc), code="invalid_registration") from None
        attester_key = parse_attester_key(registration.attester_key)
        try:
            # Off the event loop: the release lookup may read the transparency log.
            admitted = await asyncio.to_thread(admit, self.config.admission, self._releases, attester_key, registration)
            node_id, is_new = self.registry.register(
                registration, attester_key, admitted.claims.capacity, admitted.claims.iat
            )
        except ApiError as exc:
            emit("gateway.registration_refused", reason=exc.code)
            raise
        except StaleRegistrationError:
            emit("gateway.registration_refused", reason="stale_registration")
            raise ApiError(
                409, "this key registered with a newer attestation; send a fresh one", code="stale_registration"
            ) from None
        except RegistryFullError:
            emit("gateway.registration_refused", reason="registry_full")
            raise ApiError(
                503,
                "the gateway's registry is full",
                type="server_error",
                code="registry_full",
                headers={"Retry-After": "60"},
            ) from None
        emit("gateway.node_registered", new=is_new, nodes=len(self.registry))
        return JSONResponse({"node_id": node_id})

    async def nodes(self, request: Request) -> Response:
        model = request.query_params.get("model")
        if not model:
            raise ApiError(400, "query parameter 'model' is required", param="model", code="invalid_parameter")
        k, nonce = _k(request, self.config.default_k), _nonce(request)
        # A nonce makes every listed node sign a document now: a token pays for it, spent before any
        # node is asked (a listing without a nonce asks no node for anything and needs none).
        checked = self._check_token(request) if nonce is not None else None
        try:
            chosen = choose_nodes(model, self.registry.routing_entries(), k, self._rng)
        except NoNodeAvailableError:
            raise _no_node() from None
        if checked is not None:
            self._spend(*checked)
        records = [self.registry.get(entry.node_id) for entry in chosen]
        if any(record is None for record in records):  # cannot happen: no await since routing_entries()
            raise RuntimeError("a routed node is not in the registry")
        listed = [
            _listed(
                r.node_id,
                r.registration.attestation,
                r.registration.ohttp_keys,
                r.registration.evidence_json(),
                r.registration.base_attestation,
            )
            for r in records
            if r is not None
        ]
        if nonce is not None:
            listed = await self._freshly_attested(listed, nonce)
        listed = capped_listing(listed, MAX_LISTING_BYTES)
        if not listed:
            raise _no_node()
        return JSONResponse({"nodes": listed})

    async def _freshly_attested(self, listed: list[dict], nonce: bytes) -> list[dict]:
        """The listed nodes that attest now for the client's nonce, each with that document."""
        client = self._client
        if client is None:
            raise RuntimeError("the gateway's upstream client is not open: the app's lifespan has not started")
        records = [self.registry.get(entry["node_id"]) for entry in listed]
        fresh = await asyncio.gather(
            *(
                fresh_attestation(client, record, nonce, self.config.health_timeout_s, self.config.admission)
                for record in records
                if record is not None
            )
        )
        return [
            _listed(entry["node_id"], doc["attestation"], doc["ohttp_keys"], doc["evidence"], doc["base_attestation"])
            for entry, doc in zip(listed, fresh)
            if doc is not None
        ]

    async def challenge(self, request: Request) -> Response:
        if self.verifier is None:
            raise ApiError(
                404, "this gateway runs without an issuer (privacy off)", type="not_found_error", code="privacy_off"
            )
        return Response(status_code=200, headers={"WWW-Authenticate": self.verifier.www_authenticate()})

    async def ohttp(self, request: Request) -> Response:
        # The token is checked before anything else and before the body is read: a request
        # without a valid token costs one signature check, never a body's worth of memory.
        checked = self._check_token(request)
        record = self.registry.get(request.path_params["node_id"])
        if record is None:
            raise ApiError(404, "no such node", type="not_found_error", code="node_not_found")
        content_type = require_media_type(request, REQUEST_MEDIA_TYPES)
        # The body is streamed to the node as it arrives (always chunked: the framing is the
        # gateway's own), never held whole; a declared length over the cap is refused here, before
        # the token is spent (a chunked body that passes the cap on the way is cut off then: its
        # token is spent).
        _, body = stream_body(request, self.config.max_body_bytes)
        if checked is not None:
            self._spend(*checked)
        return await self._forward(record.node_id, record.registration.url, content_type, body)

    def _check_token(self, request: Request) -> tuple[Verifier, CheckedToken] | None:
        """The verifier and the request's checked (not yet spent) token; None when the token
        check is off."""
        if not self.config.privacy:
            return None
        verifier = self.verifier
        if verifier is None:
            raise RuntimeError("the token check is on but the gateway has no verifier")
        credential = request.headers.get("authorization")
        if not credential:
            raise _token_required(verifier, "a PrivateToken is required", "token_required")
        with _token_errors(verifier):
            return verifier, verifier.check_authorization(credential)

    def _spend(self, verifier: Verifier, checked: CheckedToken) -> None:
        with _token_errors(verifier):
            verifier.spend(checked)

    async def _forward(self, node_id: str, node_url: str, content_type: str, body: AsyncIterator[bytes]) -> Response:
        client = self._client
        if client is None:
            raise RuntimeError("the gateway's upstream client is not open: the app's lifespan has not started")
        upstream_request = client.build_request(
            "POST", f"{node_url}/pcc/v1/ohttp", content=body, headers={"content-type": content_type}
        )
        upstream = None
        try:
            with self.cuts.watch(node_id):  # a non-streamed answer comes whole, after the whole generation
                upstream = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            raise upstream_error(exc) from None
        if upstream is None:
            raise ApiError(502, "the node was dropped before it answered", type="server_error", code="node_unavailable")
        headers = {}
        if "content-type" in upstream.headers:
            headers["content-type"] = upstream.headers["content-type"]
        return UpstreamStream(upstream, headers, COMPONENT, self.cuts, node_id)


def _listed(node_id: str, attestation: str, ohttp_keys: str, evidence: list[dict[str, str]], base: str | None) -> dict:
    """A candidate as listed: its document, keys and, for a hardware-attested node, its evidence and
    the base document the evidence binds."""
    entry: dict = {"node_id": node_id, "attestation": attestation, "ohttp_keys": ohttp_keys}
    if evidence:
        entry["evidence"] = evidence
    if base is not None:
        entry["base_attestation"] = base
    return entry


def _entry_bytes(entry: dict) -> int:
    evidence = sum(len(v) for item in entry.get("evidence", ()) for v in item.values())
    return (
        len(entry["node_id"])
        + len(entry["attestation"])
        + len(entry["ohttp_keys"])
        + evidence
        + len(entry.get("base_attestation", ""))
    )


def capped_listing(listed: list[dict], max_bytes: int) -> list[dict]:
    """The leading entries (in drawn order) whose documents, keys and evidence fit in `max_bytes`;
    the first entry always."""
    out: list[dict] = []
    total = 0
    for entry in listed:
        total += _entry_bytes(entry)
        if out and total > max_bytes:
            break
        out.append(entry)
    return out


@contextmanager
def _token_errors(verifier: Verifier) -> Iterator[None]:
    """Token errors as their HTTP errors: 403 replayed, 401 invalid, 503 spent set full."""
    try:
        yield
    except DoubleSpendError:
        raise ApiError(403, "this token was already redeemed", type="permission_error", code="token_replayed") from None
    except TokenRejectedError:
        raise _token_required(verifier, "the PrivateToken is not valid", "token_invalid") from None
    except SpentSetFullError:
        raise ApiError(
            503,
            "the gateway cannot record more tokens now; retry later",
            type="server_error",
            code="spent_set_full",
            headers={"Retry-After": "1"},
        ) from None


def _no_node() -> ApiError:
    return ApiError(
        404, "no healthy node serves this model", type="not_found_error", param="model", code="model_not_found"
    )


def create_gateway_app(
    config: GatewayConfig,
    issuer_keys: Sequence[IssuerPublicKey] = (),
    *,
    releases: ReleaseLookup,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The gateway app. `releases` answers which logged release a node's measurement is (admission).
    Routing draws from `secrets.SystemRandom` unless a test passes `rng`."""
    if config.privacy and not issuer_keys:
        raise ValueError("the token check needs at least one issuer key")
    verifier = build_verifier(config, issuer_keys, clock) if issuer_keys else None
    gateway = Gateway(config, verifier, releases, rng if rng is not None else secrets.SystemRandom())
    routes = [
        Route("/pcc/v1/register", endpoint(COMPONENT, "register", gateway.register), methods=["POST"]),
        Route("/pcc/v1/nodes", endpoint(COMPONENT, "nodes", gateway.nodes), methods=["GET"]),
        Route("/pcc/v1/challenge", endpoint(COMPONENT, "challenge", gateway.challenge), methods=["GET"]),
        Route("/pcc/v1/ohttp/{node_id}", endpoint(COMPONENT, "ohttp", gateway.ohttp), methods=["POST"]),
    ]
    app = create_app(COMPONENT, routes, gateway.lifespan)
    app.state.gateway = gateway
    emit(
        "gateway.configured",
        token_check=config.privacy,
        issuer_keys=len(issuer_keys),
        health_interval_s=float(config.health_interval_s),
        unhealthy_after=config.unhealthy_after,
        attester_policy=config.attester_policy.value,
        evidence_policy=config.evidence_policy is not None,
    )
    return app
