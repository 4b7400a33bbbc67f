"""`traceless proxy`: an OpenAI-compatible plaintext endpoint on loopback that forwards every call
through the private path, so the openai SDK, curl and other OpenAI tools work unchanged.

It binds loopback only: what reaches it is the user's plaintext, on the user's own machine. Binding
loopback does not keep a web page out: a page can POST to 127.0.0.1 (CSRF) or have its own name
resolve to it (DNS rebinding), and spend the user's tokens. So every request must name a loopback
`Host`, any `Origin` must be a loopback one (403 otherwise), and a POST must carry a JSON content
type (415 otherwise: a page can send a form or text/plain without asking, JSON only after a CORS
preflight, which this proxy never grants).
"""
from __future__ import annotations

import re

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from traceless.client.private_client import AsyncPrivateClient, PrivateClientError, UpstreamError
from traceless.client.tokens import TokenError
from traceless.http.app import Handler, create_app, endpoint
from traceless.http.body import read_json, require_media_type
from traceless.http.errors import ApiError

COMPONENT = "proxy"
LOOPBACK = ("127.0.0.1", "::1", "localhost")
# A Host header value (or an Origin's authority) naming a loopback address, with an optional port.
_LOOPBACK_AUTHORITY = re.compile(r"(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?", re.IGNORECASE)
_LOOPBACK_ORIGIN = re.compile(r"https?://" + _LOOPBACK_AUTHORITY.pattern, re.IGNORECASE)


def local_only(handler: Handler) -> Handler:
    """Refuse (403) a request whose Host is not loopback or that a non-loopback page sent, and (415)
    a POST whose body is not declared JSON; the messages echo none of the header values."""

    async def run(request: Request) -> Response:
        if not _LOOPBACK_AUTHORITY.fullmatch(request.headers.get("host", "")):
            raise ApiError(403, "the proxy answers only requests addressed to a loopback Host",
                           type="permission_error", param="host", code="host_not_allowed")
        origin = request.headers.get("origin")
        if origin is not None and not _LOOPBACK_ORIGIN.fullmatch(origin):  # "null" included
            raise ApiError(403, "the proxy answers only requests from a loopback Origin",
                           type="permission_error", param="origin", code="origin_not_allowed")
        if request.method == "POST":
            require_media_type(request, ("application/json",))
        return await handler(request)

    return run


def create_proxy_app(client: AsyncPrivateClient, max_body_bytes: int = 4 * 2**20) -> Starlette:
    model = client.config.model

    async def call(request: Request, path: str) -> Response:
        body = await read_json(request, max_body_bytes)
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        try:
            result = await client.request(path, body)
        except UpstreamError as exc:  # the node's own (decrypted) error: pass it on unchanged
            return JSONResponse(exc.body, status_code=exc.status)
        except (PrivateClientError, TokenError):
            raise ApiError(502, "the private path could not complete this request", type="upstream_error",
                           code="private_path_failed") from None
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(result, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def chat(request: Request) -> Response:
        return await call(request, "/v1/chat/completions")

    async def completions(request: Request) -> Response:
        return await call(request, "/v1/completions")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                                          "owned_by": "traceless"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [
        Route("/v1/models", endpoint(COMPONENT, "models", local_only(models)), methods=["GET"]),
        Route("/v1/chat/completions", endpoint(COMPONENT, "chat_completions", local_only(chat)), methods=["POST"]),
        Route("/v1/completions", endpoint(COMPONENT, "completions", local_only(completions)), methods=["POST"]),
        Route("/health", endpoint(COMPONENT, "health", local_only(health)), methods=["GET"]),
    ]
    return create_app(COMPONENT, routes)
