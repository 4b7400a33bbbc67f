"""`traceless proxy`: an OpenAI-compatible plaintext endpoint on loopback that forwards every call
through the private path, so the openai SDK, curl and other OpenAI tools work unchanged.

It binds loopback only: what reaches it is the user's plaintext, on the user's own machine.
"""
from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from traceless.client.private_client import AsyncPrivateClient, PrivateClientError, UpstreamError
from traceless.client.tokens import TokenError
from traceless.http.app import create_app, endpoint
from traceless.http.body import read_json
from traceless.http.errors import ApiError

COMPONENT = "proxy"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def create_proxy_app(client: AsyncPrivateClient, max_body_bytes: int = 4 * 2**20) -> Starlette:

    async def call(request: Request, path: str) -> Response:
        body = None
        if request.method == "POST":
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
        return await call(request, "/v1/models")  # the node's own list: it knows max_model_len

    async def tokenize(request: Request) -> Response:
        return await call(request, "/tokenize")

    async def detokenize(request: Request) -> Response:
        return await call(request, "/detokenize")

    async def tokenizer_info(request: Request) -> Response:
        return await call(request, "/tokenizer_info")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [
        Route("/v1/models", endpoint(COMPONENT, "models", models), methods=["GET"]),
        Route("/v1/chat/completions", endpoint(COMPONENT, "chat_completions", chat), methods=["POST"]),
        Route("/v1/completions", endpoint(COMPONENT, "completions", completions), methods=["POST"]),
        Route("/tokenize", endpoint(COMPONENT, "tokenize", tokenize), methods=["POST"]),
        Route("/detokenize", endpoint(COMPONENT, "detokenize", detokenize), methods=["POST"]),
        Route("/tokenizer_info", endpoint(COMPONENT, "tokenizer_info", tokenizer_info), methods=["GET"]),
        Route("/health", endpoint(COMPONENT, "health", health), methods=["GET"]),
    ]
    return create_app(COMPONENT, routes)
