"""The app factory and endpoint wrapper every service uses.

- `endpoint`: runs a handler; ApiError -> its JSON error, any other exception -> an opaque 500
  (never an exception's text: it may hold request data); one `http.request` event per request
  (route, status, duration: counts only) and one `http.error` per error, unless `events` is off
  (the node's default: a per-request line carries a time and a duration an operator could read).
- `create_app`: a Starlette app whose unknown routes and methods answer in the same JSON shape,
  with no trailing-slash redirects (exactly the declared paths).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from traceless.events import emit
from traceless.http.errors import ApiError, internal_error

Handler = Callable[[Request], Awaitable[Response]]


def error_response(component: str, error: ApiError, events: bool = True) -> Response:
    if events:
        emit("http.error", component=component, status_code=error.status, error_kind=error.kind)
    return error.response()


def endpoint(component: str, route: str, handler: Handler, events: bool = True) -> Handler:
    """Wrap `handler` with the JSON error shape and (with `events`) the request event."""

    async def run(request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await handler(request)
        except ApiError as exc:
            response = error_response(component, exc, events)
        except Exception:
            response = error_response(component, internal_error(), events)
        if events:
            emit(
                "http.request",
                component=component,
                route=route,
                status_code=response.status_code,
                duration_s=time.perf_counter() - started,
                stream=isinstance(response, StreamingResponse),
            )
        return response

    return run


def _route_errors(component: str, events: bool):
    """Starlette's routing errors (unknown path, wrong method) as JSON errors."""

    async def handle(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if status == 404:
            error = ApiError(404, "no such route", type="not_found_error", code="not_found")
        elif status == 405:
            error = ApiError(405, "method not allowed", code="method_not_allowed")
        else:
            error = internal_error()
        return error_response(component, error, events)

    return handle


def create_app(component: str, routes: Sequence[BaseRoute], lifespan: Any = None, events: bool = True) -> Starlette:
    app = Starlette(
        routes=list(routes), lifespan=lifespan, exception_handlers={HTTPException: _route_errors(component, events)}
    )
    app.router.redirect_slashes = False
    return app
