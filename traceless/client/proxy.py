"""`traceless proxy`: an OpenAI-compatible plaintext endpoint on loopback that forwards every call
through the private path, so the openai SDK, curl and other OpenAI tools work unchanged.

It binds loopback only: what reaches it is the user's plaintext, on the user's own machine.
`GET /status` says which policy nodes are verified under and which attestation kind ("software",
or the hardware evidence kinds such as "snp+nvidia") each node of the last verified round used.
A stream that breaks off on the way (a node or a hop failed) ends with an OpenAI-style error event
and `[DONE]`, as the server's own streams do, so the openai SDK raises an APIError for it.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from traceless.client.private_client import AsyncPrivateClient, PrivateClientError, UpstreamError
from traceless.client.tokens import TokenError
from traceless.events import emit
from traceless.http.app import create_app, endpoint
from traceless.http.body import read_json
from traceless.http.errors import ApiError

COMPONENT = "proxy"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


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
            raise _path_failed() from None
        if isinstance(result, dict):
            return JSONResponse(result)
        return StreamingResponse(_ending_cleanly(result), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def chat(request: Request) -> Response:
        return await call(request, "/v1/chat/completions")

    async def completions(request: Request) -> Response:
        return await call(request, "/v1/completions")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                                          "owned_by": "traceless"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def status(request: Request) -> Response:
        return JSONResponse(client.status())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        client.start()  # the token wallet's schedule starts with the proxy, not with a request
        try:
            yield
        finally:
            await client.aclose()

    routes = [
        Route("/v1/models", endpoint(COMPONENT, "models", models), methods=["GET"]),
        Route("/v1/chat/completions", endpoint(COMPONENT, "chat_completions", chat), methods=["POST"]),
        Route("/v1/completions", endpoint(COMPONENT, "completions", completions), methods=["POST"]),
        Route("/health", endpoint(COMPONENT, "health", health), methods=["GET"]),
        Route("/status", endpoint(COMPONENT, "status", status), methods=["GET"]),
    ]
    app = create_app(COMPONENT, routes, lifespan=lifespan)
    app.state.private_client = client
    return app


def _path_failed() -> ApiError:
    return ApiError(502, "the private path could not complete this request", type="upstream_error",
                    code="private_path_failed")


async def _ending_cleanly(events: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """The node's events; if the stream breaks off, an error event and [DONE] instead of a cut."""
    try:
        async for event in events:
            yield event
    except PrivateClientError:
        error = _path_failed()
        emit("http.error", component=COMPONENT, status_code=error.status, error_kind="upstream")
        yield b"data: " + json.dumps(error.body(), separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
