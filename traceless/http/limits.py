"""Connection limits every service runs under (threat T28, docs/threat-model.md): how many connections
it holds, how long a client may take to send a request's head and its body (slowloris), how long
an idle keep-alive connection stays, and a lingering close for requests answered before their body
was read.

uvicorn's protocols (httptools, h11) have only the keep-alive timeout: a client that trickles a
header or a body a byte at a time holds its connection (and its buffers) for ever, and a body the
app never read is drained to its end, however large. `GuardedHttpToolsProtocol` and
`GuardedH11Protocol` add, per connection:

  connection accepted ... head complete ....... body complete ..... response sent
  |<--- head_timeout_s --->|<--- body_timeout_s --->|                 |
                                                                      |<- linger (body left unread) ->|

- over `max_connections` open connections: a JSON 503 (Retry-After) and a lingering close, before
  anything is parsed;
- a head not complete within `head_timeout_s` of the connection (or of the previous response), or a
  body not complete within `body_timeout_s` of its head: the connection is closed (the app, if it
  was reading, sees a disconnect and aborts its work);
- a response sent while the request's body is still coming (a 401 or 413 decided on the head):
  it says `connection: close`, the connection is half-closed and at most `linger_bytes` more are
  read, for at most `linger_s`, then it is closed: the client gets its answer instead of a reset,
  and its body is not drained.

Memory per connection stays bounded: a head over `max_head_bytes` gets a 431 before it is parsed,
and uvicorn stops reading a body the app has not consumed beyond 64 KiB.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # httptools: a dependency


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The documented defaults (docs/private-path.md, "Limits")."""

    max_connections: int = 1024
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    linger_s: float = 2.0
    linger_bytes: int = 256 * 1024
    max_head_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        if min(self.max_connections, self.linger_bytes, self.max_head_bytes) < 1:
            raise ValueError("max_connections, linger_bytes and max_head_bytes must be positive")
        if not min(self.head_timeout_s, self.body_timeout_s, self.keep_alive_s, self.linger_s) > 0:
            raise ValueError("the timeouts must be positive")


def _raw_error(status: str, message: str, code: str, extra: bytes = b"") -> bytes:
    """A whole JSON error response, written on the transport before (or instead of) parsing."""
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "server_error" if status.startswith("5") else "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n".encode()
        + extra
        + b"connection: close\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


_BUSY = _raw_error(
    "503 Service Unavailable",
    "the server has too many open connections; retry later",
    "too_many_connections",
    b"retry-after: 1\r\n",
)
_HEAD_TOO_LARGE = _raw_error("431 Request Header Fields Too Large", "the request head is too large", "head_too_large")


class _Guard:
    """The limits, shared by the two protocols below, which call `_guard_*` from their parser hooks
    (one protocol instance per connection)."""

    # provided by the uvicorn protocol it is mixed into
    loop: asyncio.AbstractEventLoop
    connections: set
    app: Any
    _unset_keepalive_if_required: Callable[[], None]

    def _guard_init(self, limits: ConnectionLimits) -> None:
        self._limits = limits
        self.app = _close_if_body_unread(self.app)
        self._raw: asyncio.Transport | None = None  # the connection's transport (uvicorn gets a wrapper)
        self._deadline: asyncio.TimerHandle | None = None
        self._phase: str | None = None  # "head", "body", or None (no client deadline running)
        self._head_bytes = 0  # bytes of a head still incomplete
        self._lingering_left: int | None = None  # bytes still read while lingering; None: not lingering

    def _body_unread(self) -> bool:
        """Whether the current request's body is still (partly) unread; per parser."""
        raise NotImplementedError

    def _guard_transport(self, transport: asyncio.Transport) -> asyncio.Transport:
        """What uvicorn is given instead of `transport`: the same, except that closing it while
        the request's body is unread is a lingering close."""
        self._raw = transport
        return cast(asyncio.Transport, _LingerOnClose(transport, self))

    def _close_or_linger(self) -> None:
        if self._body_unread():
            self._linger()
        else:
            self._transport().close()

    def _transport(self) -> asyncio.Transport:
        if self._raw is None:
            raise RuntimeError("the connection is not made yet")
        return self._raw

    def _guard_connection_made(self) -> None:
        if len(self.connections) > self._limits.max_connections:
            self._transport().write(_BUSY)
            self._linger()
        else:
            self._arm("head", self._limits.head_timeout_s)

    def _guard_lingering(self, data: bytes) -> bool:
        """True when `data` was taken by a lingering close (and is not to be parsed)."""
        if self._lingering_left is None:
            return False
        self._lingering_left -= len(data)
        if self._lingering_left < 0:
            self._transport().close()
        return True

    def _guard_head_too_large(self, data: bytes) -> bool:
        """Before parsing `data`: True (and a 431 sent) when it takes the head past max_head_bytes.
        The head ends at the first blank line; bytes after it are body or a next request. Bytes
        arriving while no client deadline runs (keep-alive, or a request being answered) begin a
        new head."""
        if self._phase is None:
            self._arm("head", self._limits.head_timeout_s)
        if self._phase != "head":
            return False
        end = data.find(b"\r\n\r\n")
        self._head_bytes += len(data) if end < 0 else end + 4
        if self._head_bytes <= self._limits.max_head_bytes:
            return False
        self._transport().write(_HEAD_TOO_LARGE)
        self._linger()
        return True

    def _guard_head_started(self) -> None:
        if self._phase != "head":
            self._arm("head", self._limits.head_timeout_s)

    def _guard_head_done(self) -> None:
        self._arm("body", self._limits.body_timeout_s)

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._phase, self._head_bytes = phase, 0
        self._deadline = self.loop.call_later(seconds, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._phase = None, None

    def _late(self) -> None:
        self._deadline, self._phase = None, None
        if not self._transport().is_closing():
            self._transport().close()

    def _linger(self) -> None:
        """Half-close after the response, read (and drop) a little more, then close."""
        self._unset_keepalive_if_required()
        if self._lingering_left is not None:
            return
        self._disarm()
        self._lingering_left = self._limits.linger_bytes
        transport = self._transport()
        if transport.is_closing():
            return
        if transport.can_write_eof():
            transport.write_eof()
        transport.resume_reading()
        self._deadline = self.loop.call_later(self._limits.linger_s, self._late)


class _LingerOnClose:
    """A transport whose close() is the protocol's close-or-linger; all else is the transport's."""

    def __init__(self, transport: asyncio.Transport, guard: _Guard) -> None:
        self._transport = transport
        self._guard = guard

    def close(self) -> None:
        self._guard._close_or_linger()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _expects_body(scope: Any) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _close_if_body_unread(app: Any) -> Any:
    """ASGI middleware: a response that starts before the request's body was read to its end says
    `connection: close` (the rest of the body will not be read: a client must not reuse the
    connection); the server then closes it with a lingering close."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _expects_body(scope):
            return await app(scope, receive, send)
        body_read = False

        async def tracked_receive() -> Any:
            nonlocal body_read
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body_read = True
            return message

        async def marked_send(message: Any) -> None:
            if message["type"] == "http.response.start" and not body_read:
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        return await app(scope, tracked_receive, marked_send)

    return guarded


class GuardedHttpToolsProtocol(_Guard, HttpToolsProtocol):
    """uvicorn's httptools protocol (its default where httptools is installed) with the limits."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ConnectionLimits,
    ) -> None:
        HttpToolsProtocol.__init__(self, config, server_state, app_state, _loop)
        self._guard_init(limits)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        HttpToolsProtocol.connection_made(self, self._guard_transport(transport))
        self._guard_connection_made()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        HttpToolsProtocol.connection_lost(self, exc)

    def data_received(self, data: bytes) -> None:
        if not self._guard_lingering(data) and not self._guard_head_too_large(data):
            HttpToolsProtocol.data_received(self, data)

    def on_message_begin(self) -> None:
        HttpToolsProtocol.on_message_begin(self)
        self._guard_head_started()

    def on_headers_complete(self) -> None:
        HttpToolsProtocol.on_headers_complete(self)
        self._guard_head_done()

    def on_message_complete(self) -> None:
        HttpToolsProtocol.on_message_complete(self)
        self._disarm()

    def _body_unread(self) -> bool:
        # more_body stays true when the response completed before the body was read to its end
        return self.cycle is not None and self.cycle.more_body and not self.pipeline

    def on_response_complete(self) -> None:
        body_unread = self._body_unread()
        HttpToolsProtocol.on_response_complete(self)
        if body_unread:
            self._linger()


class GuardedH11Protocol(_Guard, H11Protocol):
    """uvicorn's h11 protocol (where httptools is not installed) with the limits."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ConnectionLimits,
    ) -> None:
        H11Protocol.__init__(self, config, server_state, app_state, _loop)
        self._guard_init(limits)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        H11Protocol.connection_made(self, self._guard_transport(transport))
        self._guard_connection_made()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        H11Protocol.connection_lost(self, exc)

    def data_received(self, data: bytes) -> None:
        if not self._guard_lingering(data) and not self._guard_head_too_large(data):
            H11Protocol.data_received(self, data)
            self._follow_request()

    def _body_unread(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY

    def on_response_complete(self) -> None:
        body_unread = self._body_unread()
        H11Protocol.on_response_complete(self)
        if body_unread:
            self._linger()
        else:
            self._follow_request()

    def _follow_request(self) -> None:
        """Run the deadline that matches where the client is in its request."""
        state = self.conn.their_state  # DONE from the end of a request until its response is sent
        if state is h11.IDLE:
            if self.timeout_keep_alive_task is None:  # a new head has begun to arrive
                self._guard_head_started()
        elif state is h11.SEND_BODY:
            if self._phase != "body":
                self._guard_head_done()
        else:
            self._disarm()


def protocol_class(limits: ConnectionLimits, parser: str = "httptools") -> Any:
    """What uvicorn's Config takes as `http=`: builds one guarded protocol per connection, on
    httptools (uvicorn's own choice where it is installed, as here) or on h11."""
    if parser not in ("httptools", "h11"):
        raise ValueError("parser must be httptools or h11")
    return functools.partial(GuardedHttpToolsProtocol if parser == "httptools" else GuardedH11Protocol, limits=limits)


def uvicorn_options(limits: ConnectionLimits, parser: str = "httptools") -> dict[str, Any]:
    return {
        "http": protocol_class(limits, parser),
        "timeout_keep_alive": limits.keep_alive_s,
        "h11_max_incomplete_event_size": limits.max_head_bytes,
    }
