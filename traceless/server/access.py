"""Who may call the plaintext server: a bearer token and the browser origins allowed.

- `api_key` (`serve --api-key`, vLLM's option): every route but `/health` answers 401 unless the
  request carries `Authorization: Bearer <key>`, compared in constant time.
- `allowed_origins` (`serve --allowed-origins`): a request a browser page sent carries an `Origin`;
  one not listed gets 403 (a page on another site must not spend this server's compute or read its
  answers), a listed one gets CORS headers and its preflight answered. None are listed by default.

Error messages echo none of the header values.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from traceless.http.app import error_response
from traceless.http.errors import ApiError

OPEN_PATHS = ("/health",)


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key must not be empty")


def protect(app: Starlette, policy: AccessPolicy, component: str) -> None:
    """Put `app` behind the origin check, then CORS for the allowed origins, then the key check
    (Starlette runs the middleware added last first)."""
    if policy.api_key is not None:
        app.add_middleware(_KeyCheck, key=policy.api_key, component=component)
    if policy.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(policy.allowed_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
        )
    app.add_middleware(_OriginCheck, allowed=policy.allowed_origins, component=component)


class _OriginCheck:
    def __init__(self, app: ASGIApp, allowed: tuple[str, ...], component: str) -> None:
        self.app, self.allowed, self.component = app, allowed, component

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            origin = _header(scope, b"origin")
            if origin is not None and origin not in self.allowed:  # "null" included
                error = ApiError(
                    403,
                    "requests from a browser origin are refused unless the server allows it (--allowed-origins)",
                    type="permission_error",
                    param="origin",
                    code="origin_not_allowed",
                )
                await error_response(self.component, error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _KeyCheck:
    def __init__(self, app: ASGIApp, key: str, component: str) -> None:
        self.app, self.component = app, component
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = _header(scope, b"authorization") or ""
            if not hmac.compare_digest(given.encode(), self.expected):
                error = ApiError(
                    401,
                    "a valid API key is required: send it as 'Authorization: Bearer KEY'",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await error_response(self.component, error)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None
