"""Reading what a client sent, at the boundary: bodies under a cap (413), whole or streamed on to
an upstream, JSON (400), media types (415)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import ClientDisconnect, Request

from traceless.http.errors import ApiError


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body exceeds {limit} bytes", code="body_too_large")


def _left() -> ApiError:
    # Nobody reads this answer; it keeps a client that left (or was cut off by the body timeout)
    # from counting as a server error.
    return ApiError(400, "the client disconnected before its whole body arrived", code="client_disconnected")


def declared_length(request: Request, limit: int) -> int | None:
    """The request's Content-Length (None when it has none: chunked); 413 when it exceeds `limit`,
    before anything is read."""
    declared = request.headers.get("content-length")
    if declared is None:
        return None
    if not declared.isdigit():  # the HTTP parser refuses this before the app sees it; not relied on
        raise ApiError(400, "content-length must be a decimal number", param="content-length")
    if int(declared) > limit:
        raise _too_large(limit)
    return int(declared)


def stream_body(request: Request, limit: int) -> tuple[int | None, AsyncIterator[bytes]]:
    """(declared length, the body's chunks as they arrive) for passing a body on without holding it:
    413 at once for a declared length over `limit`, or raised from the iterator as soon as more
    than `limit` bytes have come."""
    declared = declared_length(request, limit)

    async def chunks() -> AsyncIterator[bytes]:
        received = 0
        try:
            async for chunk in request.stream():
                received += len(chunk)
                if received > limit:
                    raise _too_large(limit)
                if chunk:
                    yield chunk
        except ClientDisconnect:
            raise _left() from None

    return declared, chunks()


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it is known to exceed `limit` bytes: a declared
    length over the limit is refused before anything is read."""
    declared_length(request, limit)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _too_large(limit)
    except ClientDisconnect:
        raise _left() from None
    return bytes(body)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_json(raw: bytes | bytearray | str) -> Any:
    """JSON text -> a value, or ValueError for anything that is not plain, valid JSON: a syntax
    error, bytes that are not UTF-8 (strictly: no encoded surrogates, no UTF-16 bodies), nesting
    deeper than the parser's recursion limit, an integer past Python's digit limit, or a lone
    surrogate escape (`"\\ud800"`: a str no encoder can write, which would fail deep in a handler)."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8")  # no bytes copy of a wipeable buffer
    if isinstance(raw, str) and _SURROGATE.search(raw):
        raise ValueError("the JSON has a lone surrogate")
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("the JSON nests too deeply") from None
    if _SURROGATE_ESCAPE.search(text) and _has_surrogate(value):  # a surrogate pair decodes to one char
        raise ValueError("the JSON has a lone surrogate")
    return value


def _has_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return True
        elif isinstance(v, dict):
            stack += v
            stack += v.values()
        elif isinstance(v, list):
            stack += v
    return False


def parse_json(raw: bytes | bytearray) -> Any:
    try:
        return decode_json(raw)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None


async def read_json(request: Request, limit: int):
    return parse_json(await read_body(request, limit))


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def require_media_type(request: Request, allowed: tuple[str, ...]) -> str:
    """The request's media type if it is one of `allowed`; 415 otherwise."""
    found = media_type(request)
    if found not in allowed:
        raise ApiError(
            415, f"content-type must be {' or '.join(allowed)}", param="content-type", code="unsupported_media_type"
        )
    return found
