"""The Privacy Pass token issuer service (`traceless issuer`; docs/private-path.md).

    GET  /token-issuer-directory  {"issuer-request-uri": "/token-request",
                                   "token-keys": [{"token-type": 2, "token-key": b64url SPKI}]}
    POST /token-request           message/token-request -> message/token-response
    POST /token-request-batch     (uint16 len || TokenRequest)* -> (uint16 len || TokenResponse)*

Both POSTs need `Authorization: Bearer <api key>`. The issuer knows its users but never sees a
token: it signs blinded messages (RFC 9578 section 6) and takes no part in redemption, so it
cannot link a token it issued to the request that later spends it. Its whole state is the
signing key (generated at start, memory only), the API-key digests and one counter per user
(`TokenIssuanceService`); nothing is kept per request or per token.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from traceless.events import emit
from traceless.http.app import create_app, endpoint
from traceless.http.body import read_body, require_media_type
from traceless.http.errors import ApiError, internal_error
from traceless.privacy.privacypass.batch_issuance import ApiKeyStore, TokenIssuanceService
from traceless.privacy.privacypass.errors import (
    AuthenticationError,
    BatchTooLargeError,
    RateLimitExceededError,
    TokenError,
)
from traceless.privacy.privacypass.http import b64url_encode
from traceless.privacy.privacypass.protocol import Issuer
from traceless.privacy.privacypass.rate_limit import RateLimit
from traceless.privacy.privacypass.token_batch import (
    BATCH_REQUEST_MEDIA_TYPE,
    BATCH_RESPONSE_MEDIA_TYPE,
    ISSUER_DIRECTORY_MEDIA_TYPE,
    TOKEN_REQUEST_MEDIA_TYPE,
    TOKEN_RESPONSE_MEDIA_TYPE,
    decode_batch,
    encode_batch,
)
from traceless.privacy.privacypass.wire import NK, TOKEN_TYPE_BLIND_RSA

COMPONENT = "issuer"
REQUEST_URI = "/token-request"
BATCH_URI = "/token-request-batch"
_TOKEN_REQUEST_LEN = 3 + NK  # token_type, truncated_token_key_id, blinded_msg
_BEARER_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="traceless-issuer"'}


@dataclass(frozen=True, slots=True)
class IssuerConfig:
    """Per-user quota (tokens per fixed window), batch size and body size limits.

    max_body_bytes defaults to what a full batch needs: max_batch framed TokenRequests.
    """

    tokens_per_window: int = 1000
    window_seconds: float = 3600.0
    max_batch: int = 100
    max_body_bytes: int | None = None

    def __post_init__(self) -> None:
        self.rate_limit()  # validates the quota fields
        if self.max_body_bytes is not None and self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be positive")

    @property
    def body_limit(self) -> int:
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return self.max_batch * (2 + _TOKEN_REQUEST_LEN)

    def rate_limit(self) -> RateLimit:
        return RateLimit(self.tokens_per_window, self.window_seconds, self.max_batch)


def load_api_keys(path: str | Path) -> ApiKeyStore:
    """Load `--api-keys FILE`: a JSON object {api_key: user_id}, one key per user.

    The file is keyed by API key (docs/private-path.md); ApiKeyStore is keyed by user, so the
    mapping is inverted here. Raises ValueError naming what is wrong, never a key.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("the API key file is not valid JSON") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ValueError("the API key file must hold a JSON object {api_key: user_id}")
    users: dict[str, str] = {}
    for api_key, user_id in data.items():
        if user_id in users:
            raise ValueError("the API key file gives one user two keys; one key per user")
        users[user_id] = api_key
    return ApiKeyStore(users)


def _bearer_key(request: Request) -> str:
    value = request.headers.get("authorization", "")
    scheme, _, key = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(
            401,
            "an API key is required: Authorization: Bearer <key>",
            type="authentication_error",
            code="missing_api_key",
            headers=_BEARER_CHALLENGE,
        )
    return key.strip()


def _api_error(exc: TokenError) -> ApiError:
    """Token errors carry structural messages only (no keys, no values), safe to return."""
    if isinstance(exc, AuthenticationError):
        return ApiError(
            401, "invalid API key", type="authentication_error", code="invalid_api_key", headers=_BEARER_CHALLENGE
        )
    if isinstance(exc, RateLimitExceededError):
        retry_after = max(1, math.ceil(exc.retry_after))
        return ApiError(
            429,
            "token quota for this window exceeded",
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(retry_after)},
        )
    if isinstance(exc, BatchTooLargeError):
        return ApiError(413, str(exc), code="batch_too_large")
    if exc.http_status == 400:
        return ApiError(400, str(exc), code="invalid_token_request")
    return internal_error()


class _IssuerEndpoints:
    """The route handlers over one TokenIssuanceService."""

    __slots__ = ("_service", "_config")

    def __init__(self, service: TokenIssuanceService, config: IssuerConfig) -> None:
        self._service = service
        self._config = config

    async def directory(self, request: Request) -> Response:
        key = {"token-type": TOKEN_TYPE_BLIND_RSA, "token-key": b64url_encode(self._service.issuer_key.spki)}
        body = {"issuer-request-uri": REQUEST_URI, "token-keys": [key]}
        return JSONResponse(body, media_type=ISSUER_DIRECTORY_MEDIA_TYPE)

    def _authenticated_key(self, request: Request) -> str:
        """The request's API key, checked on the head: an unknown key is 401 before any body is read."""
        api_key = _bearer_key(request)
        try:
            self._service.authenticate(api_key)
        except TokenError as exc:
            raise _api_error(exc) from None
        return api_key

    async def single(self, request: Request) -> Response:
        api_key = self._authenticated_key(request)
        require_media_type(request, (TOKEN_REQUEST_MEDIA_TYPE,))
        body = await read_body(request, self._config.body_limit)
        (response,) = await self._issue(api_key, [body])
        return Response(response, media_type=TOKEN_RESPONSE_MEDIA_TYPE)

    async def batch(self, request: Request) -> Response:
        api_key = self._authenticated_key(request)
        require_media_type(request, (BATCH_REQUEST_MEDIA_TYPE,))
        body = await read_body(request, self._config.body_limit)
        try:
            items = decode_batch(body)
        except TokenError as exc:
            raise _api_error(exc) from None
        responses = await self._issue(api_key, items)
        return Response(encode_batch(responses), media_type=BATCH_RESPONSE_MEDIA_TYPE)

    async def _issue(self, api_key: str, items: list[bytes]) -> list[bytes]:
        # Blind signing costs ~1 ms of CPU per token: off the event loop, so a batch does not
        # stall other requests. The service and its rate limiter are thread-safe.
        try:
            responses = await run_in_threadpool(self._service.issue_batch, api_key, items)
        except TokenError as exc:
            raise _api_error(exc) from None
        emit("issuer.issued", tokens=len(responses))
        return responses


def create_issuer_app(
    config: IssuerConfig,
    api_keys: ApiKeyStore,
    *,
    issuer: Issuer | None = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The issuer app; a fresh signing key unless `issuer` is given. `clock` is for tests.

    `app.state.service` exposes the issuance service so tests can audit what it keeps.
    """
    service = TokenIssuanceService(issuer or Issuer.generate(), api_keys, config.rate_limit(), clock=clock)
    handlers = _IssuerEndpoints(service, config)
    routes = [
        Route("/token-issuer-directory", endpoint(COMPONENT, "token_directory", handlers.directory), methods=["GET"]),
        Route(REQUEST_URI, endpoint(COMPONENT, "token", handlers.single), methods=["POST"]),
        Route(BATCH_URI, endpoint(COMPONENT, "token_batch", handlers.batch), methods=["POST"]),
    ]
    app = create_app(COMPONENT, routes)
    app.state.service = service
    return app
