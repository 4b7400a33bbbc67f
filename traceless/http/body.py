"""Reading what a client sent, at the boundary: bodies under a cap (413), JSON (400), media
types (415)."""
from __future__ import annotations

import json

from starlette.requests import Request

from traceless.http.errors import ApiError


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the request body exceeds {limit} bytes", code="body_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it is known to exceed `limit` bytes: a declared
    length over the limit is refused before anything is read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def parse_json(raw: bytes | bytearray):
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None


async def read_json(request: Request, limit: int):
    return parse_json(await read_body(request, limit))


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


def require_media_type(request: Request, allowed: tuple[str, ...]) -> str:
    """The request's media type if it is one of `allowed`; 415 otherwise."""
    found = media_type(request)
    if found not in allowed:
        raise ApiError(415, f"content-type must be {' or '.join(allowed)}", param="content-type",
                       code="unsupported_media_type")
    return found
