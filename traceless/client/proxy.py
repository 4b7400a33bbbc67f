"""`traceless proxy`: an OpenAI-compatible plaintext endpoint on loopback that forwards every call
through the private path, so the openai SDK, curl and other OpenAI tools work unchanged.

It binds loopback only: what reaches it is the user's plaintext, on the user's own machine.
"""
from __future__ import annotations

import json
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from traceless.client.private_client import AsyncPrivateClient, PrivateClientError, UpstreamError
from traceless.client.tokens import TokenError
from traceless.events import emit
from traceless.server.app import read_json_body
from traceless.server.errors import ApiError
from traceless.server.http_common import route_error

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def create_proxy_app(client: AsyncPrivateClient, max_body_bytes: int = 4 * 2**20) -> Starlette:
    model = client.config.model

    async def call(request: Request, path: str, route: str) -> Response:
        t0, status, stream = time.monotonic(), 500, False
        try:
            body = await read_json_body(request, max_body_bytes)
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be a JSON object")
            stream = body.get("stream") is True
            result = await client.request(path, body)
            status = 200
            if isinstance(result, dict):
                return JSONResponse(result)
            return StreamingResponse(result, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        except UpstreamError as exc:  # the node's own (decrypted) error: pass it on unchanged
            status = exc.status
            return JSONResponse(exc.body, status_code=exc.status)
        except ApiError as exc:
            status = exc.status
            return exc.response()
        except (PrivateClientError, TokenError):
            status = 502
            return ApiError(502, "the private path could not complete this request", type="upstream_error",
                            code="private_path_failed").response()
        finally:
            emit("http.request", component="proxy", route=route, status_code=status,
                 duration_s=time.monotonic() - t0, stream=stream)

    async def chat(request: Request) -> Response:
        return await call(request, "/v1/chat/completions", "chat_completions")

    async def completions(request: Request) -> Response:
        return await call(request, "/v1/completions", "completions")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                                          "owned_by": "traceless"}]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: route_error})


def dumps(obj) -> bytes:
    return json.dumps(obj).encode()
