"""HTTP plumbing shared by the issuer, gateway and relay.

- `endpoint`: runs a handler, turns typed errors into OpenAI-shaped JSON errors and emits one
  `http.request` event (route, status, duration: counts only).
- `read_body` / `require_media_type`: validation at the boundary (413, 415).
- `upstream_client` / `UpstreamStream`: forwarding. The upstream client sends no default
  headers of its own (no User-Agent, no Accept-Encoding: a compressed upstream body would be
  passed on raw) and keeps no cookies; an upstream response is streamed back as its bytes
  arrive, never buffered whole. Closing the downstream response (done or client gone) closes
  the upstream one, so a node stops work for a client that left.
"""
from __future__ import annotations

import http.cookiejar
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from traceless.events import emit
from traceless.server.errors import ApiError, internal_error

OHTTP_REQUEST_MEDIA_TYPES = ("message/ohttp-req", "message/ohttp-chunked-req")
# httpx adds these to every request unless told otherwise; none is ours to send.
_HTTPX_DEFAULT_HEADERS = ("accept", "accept-encoding", "connection", "user-agent")
# Event error kinds for codes whose status alone would be ambiguous.
_KIND_BY_CODE = {
    "token_required": "token_invalid", "token_invalid": "token_invalid",
    "token_replayed": "token_replayed", "spent_set_full": "unavailable",
    "upstream_unreachable": "upstream", "upstream_timeout": "timeout",
    "unsupported_media_type": "invalid_request", "method_not_allowed": "invalid_request",
}

Handler = Callable[[Request], Awaitable[Response]]


def error_kind(error: ApiError) -> str:
    """The events-schema kind for an error: by code where one is mapped, else by status."""
    return _KIND_BY_CODE.get(error.code or "", error.kind)


def error_response(component: str, error: ApiError) -> Response:
    emit("http.error", component=component, status_code=error.status, error_kind=error_kind(error))
    return error.response()


def endpoint(component: str, route: str, handler: Handler) -> Handler:
    """Wrap `handler`: ApiError -> its JSON error, anything else -> opaque 500; one event each."""

    async def run(request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except ApiError as exc:
            response = error_response(component, exc)
        except Exception:  # never echo an exception's text: it may hold request data
            response = error_response(component, internal_error())
        emit("http.request", component=component, route=route, status_code=response.status_code,
             duration_s=time.perf_counter() - started,
             stream=isinstance(response, StreamingResponse))
        return response

    return run


def http_exception_handler(component: str):
    """Starlette's routing errors (unknown path, wrong method) as JSON errors."""

    async def handle(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if status == 404:
            error = ApiError(404, "no such route", type="not_found_error", code="not_found")
        elif status == 405:
            error = ApiError(405, "method not allowed", code="method_not_allowed")
        else:
            error = internal_error()
        return error_response(component, error)

    return handle


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def require_media_type(request: Request, allowed: tuple[str, ...]) -> str:
    """The request's media type if it is one of `allowed`; 415 otherwise."""
    found = media_type(request)
    if found not in allowed:
        raise ApiError(415, f"content-type must be {' or '.join(allowed)}", param="content-type",
                       code="unsupported_media_type")
    return found


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body exceeds {limit} bytes", code="body_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def upstream_client(read_timeout_s: float, connect_timeout_s: float = 5.0) -> httpx.AsyncClient:
    """An AsyncClient that sends only the headers each call names (plus Host and framing)."""
    timeout = httpx.Timeout(connect_timeout_s, read=read_timeout_s)
    # A cookie jar would let an upstream set a value that the client then sends with every
    # later request, whoever it carries: a tag shared across users. This jar accepts none.
    no_cookies = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    client = httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False,
                               cookies=no_cookies)
    for name in _HTTPX_DEFAULT_HEADERS:
        del client.headers[name]
    return client


class UpstreamStream(StreamingResponse):
    """Stream an httpx response (opened with stream=True) back as it arrives.

    `headers` are the only response headers passed on; the upstream response is closed when
    this one ends for any reason: finished, failed, or the client disconnected (Starlette then
    cancels the body loop).
    """

    def __init__(self, upstream: httpx.Response, headers: dict[str, str], component: str) -> None:
        super().__init__(self._body(upstream, component), status_code=upstream.status_code, headers=headers)
        self._upstream = upstream

    @staticmethod
    async def _body(upstream: httpx.Response, component: str) -> AsyncIterator[bytes]:
        try:
            async for data in upstream.aiter_raw():
                yield data
        except httpx.HTTPError:
            # The status is already sent: all that is left is to cut the connection, so the
            # client sees a truncated body (which OHTTP decryption refuses) rather than an end.
            emit("http.error", component=component, status_code=502, error_kind="upstream")
            raise

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._upstream.aclose()


def upstream_error(exc: httpx.HTTPError) -> ApiError:
    """502 for an upstream that cannot be reached or fails before its response starts; 504
    when it was reached but sent no response in time."""
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return ApiError(504, "the upstream service did not answer in time", type="server_error",
                        code="upstream_timeout")
    return ApiError(502, "the upstream service could not be reached", type="server_error",
                    code="upstream_unreachable")
