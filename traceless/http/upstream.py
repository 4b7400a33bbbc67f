"""Forwarding to an upstream service (gateway -> node, relay -> gateway).

The upstream client sends no default headers of its own (no User-Agent, no Accept-Encoding: a
compressed upstream body would be passed on raw) and keeps no cookies; an upstream response is
streamed back as its bytes arrive, never buffered whole. Closing the downstream response (done or
client gone) closes the upstream one, so a node stops work for a client that left.

An upstream host that vanishes (power, link) sends no FIN and no RST: a read from it waits out its
whole timeout, which is long since a node may queue a request before its first byte. `Cuts` lets
whoever learns that the upstream is gone (the gateway's health checks) cut every call still in
flight to it at once: the downstream connection is then cut too, so the client sees a truncated
response (which OHTTP decryption refuses) within the detection time, not a hang.
"""

from __future__ import annotations

import http.cookiejar
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import anyio
import httpx
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from traceless.events import emit
from traceless.http.errors import ApiError

# httpx adds these to every request unless told otherwise; none is ours to send.
_HTTPX_DEFAULT_HEADERS = ("accept", "accept-encoding", "connection", "user-agent")


def upstream_client(read_timeout_s: float, connect_timeout_s: float = 5.0) -> httpx.AsyncClient:
    """An AsyncClient that sends only the headers each call names (plus Host and framing)."""
    timeout = httpx.Timeout(connect_timeout_s, read=read_timeout_s)
    # A cookie jar would let an upstream set a value that the client then sends with every
    # later request, whoever it carries: a tag shared across users. This jar accepts none.
    no_cookies = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    # No cap on the pool's connections (httpx's default is 100): each downstream request holds at
    # most one, and the downstream connections are capped (http/limits.py); a pool cap would let
    # 100 slow uploads or long streams make every other request wait for a free connection.
    pool = httpx.Limits(max_connections=None, max_keepalive_connections=100)
    client = httpx.AsyncClient(
        timeout=timeout, follow_redirects=False, trust_env=False, cookies=no_cookies, limits=pool
    )
    for name in _HTTPX_DEFAULT_HEADERS:
        del client.headers[name]
    return client


class UpstreamCutError(Exception):
    """A response was cut because its upstream was found gone (`Cuts.cut`)."""


class Cuts:
    """In-flight upstream calls by upstream (the gateway: by node id), each under a cancel scope,
    so that all the calls to one upstream can be cut at once. Confined to one event loop."""

    def __init__(self) -> None:
        self._scopes: dict[str, set[anyio.CancelScope]] = {}

    @contextmanager
    def watch(self, key: str) -> Iterator[anyio.CancelScope]:
        """A cancel scope for a call to `key`: the block is cancelled if `key` is cut meanwhile
        (the scope's `cancelled_caught` tells afterwards). Enter and leave it in one task."""
        scope = anyio.CancelScope()
        self._scopes.setdefault(key, set()).add(scope)
        try:
            with scope:
                yield scope
        finally:
            watched = self._scopes.get(key)
            if watched is not None:
                watched.discard(scope)
                if not watched:
                    del self._scopes[key]

    def cut(self, key: str) -> int:
        """Cancel every call in flight to `key`; returns how many there were."""
        scopes = self._scopes.pop(key, set())
        for scope in scopes:
            scope.cancel()
        return len(scopes)

    def __len__(self) -> int:
        return sum(len(s) for s in self._scopes.values())


class UpstreamStream(StreamingResponse):
    """Stream an httpx response (opened with stream=True) back as it arrives.

    `headers` are the only response headers passed on; the upstream response is closed when
    this one ends for any reason: finished, failed, the client disconnected (Starlette then
    cancels the body loop), or, with `cuts`, the upstream `key` was cut (then the downstream
    connection is cut as well: UpstreamCutError, the server drops it without a proper end).
    """

    def __init__(
        self, upstream: httpx.Response, headers: dict[str, str], component: str, cuts: Cuts | None = None, key: str = ""
    ) -> None:
        super().__init__(self._body(upstream, component), status_code=upstream.status_code, headers=headers)
        self._upstream = upstream
        self._component = component
        self._cuts, self._key = cuts, key

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
            if self._cuts is None:
                await super().__call__(scope, receive, send)
                return
            with self._cuts.watch(self._key) as watch:
                await super().__call__(scope, receive, send)
            if watch.cancelled_caught:
                emit("http.error", component=self._component, status_code=502, error_kind="unavailable")
                raise UpstreamCutError("the upstream was found gone mid-response")
        finally:
            await self._upstream.aclose()


def upstream_error(exc: httpx.HTTPError) -> ApiError:
    """502 for an upstream that cannot be reached or fails before its response starts; 504
    when it was reached but sent no response in time."""
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return ApiError(
            504, "the upstream service did not answer in time", type="server_error", code="upstream_timeout"
        )
    return ApiError(502, "the upstream service could not be reached", type="server_error", code="upstream_unreachable")
