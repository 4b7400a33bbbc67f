"""`traceless proxy`: an OpenAI-compatible plaintext endpoint on loopback that forwards every call
through the private path, so the openai SDK, curl and other OpenAI tools work unchanged.

It binds loopback only: what reaches it is the user's plaintext, on the user's own machine. Binding
loopback does not keep a web page out: a page can POST to 127.0.0.1 (CSRF) or have its own name
resolve to it (DNS rebinding), and spend the user's tokens. So every request must name a loopback
`Host`, any `Origin` must be a loopback one (403 otherwise), and a POST must carry a JSON content
type (415 otherwise: a page can send a form or text/plain without asking, JSON only after a CORS
preflight, which this proxy never grants).
A browser also names the page's site in `Sec-Fetch-Site` (on no-cors GETs too, which carry no
`Origin`): `cross-site` and `same-site` are refused (403). `/v1/models` and `/tokenizer_info` are
fetched over the private path once and then served from that answer, so no request can make the
proxy spend tokens on them again.
`GET /status` says which policy nodes are verified under, which attestation kind ("software",
or the hardware evidence kinds such as "snp+nvidia") each node of the last verified round used,
and whether the client's routing watch found its requests concentrated on one node (every answer
also carries `x-traceless-routing: ok | concentrated`).
A failure of the private path is an OpenAI-style error whose status and code name its cause
(errors.FailureCause: 503 relay_unreachable / no_healthy_node / tokens_unavailable, 429
quota_exhausted, 502 private_path_failed / token_refused / duplicate_listing), always with
`x-should-retry: false`: the openai SDK honours it and does not retry (it would retry a 5xx or a
429 twice by default). A caller that retries anyway gets the same node: the client keeps a failed
request's draw (node_choice.Draws).
A stream that breaks off on the way (a node or a hop failed) ends with an OpenAI-style error event
and `[DONE]`, as the server's own streams do, so the openai SDK raises an APIError for it. A path
that goes silent past the client's timeouts (a stream's head, the gap between chunks, a whole
non-streamed answer) is 504 `upstream_timeout`, as a status or as that event.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from traceless.events import emit
from traceless.http.app import Handler, create_app, endpoint
from traceless.http.body import read_json, require_media_type
from traceless.http.errors import ApiError
from traceless.http.openai_routes import OPENAI_ROUTES, OpenAIRoute, RouteKind
from traceless_tools.client.errors import FailureCause, PrivateClientError, UpstreamError
from traceless_tools.client.private_client import AsyncPrivateClient

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
            raise ApiError(
                403,
                "the proxy answers only requests addressed to a loopback Host",
                type="permission_error",
                param="host",
                code="host_not_allowed",
            )
        origin = request.headers.get("origin")
        if origin is not None and not _LOOPBACK_ORIGIN.fullmatch(origin):  # "null" included
            raise ApiError(
                403,
                "the proxy answers only requests from a loopback Origin",
                type="permission_error",
                param="origin",
                code="origin_not_allowed",
            )
        if request.headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
            raise ApiError(
                403,
                "the proxy answers no request a web page of another site sent",
                type="permission_error",
                param="sec-fetch-site",
                code="site_not_allowed",
            )
        if request.method == "POST":
            require_media_type(request, ("application/json",))
        return await handler(request)

    return run


class _Handlers:
    """The proxy's handlers over one client: every call goes over the private path, but the two GETs
    whose answers never change (`/v1/models`, `/tokenizer_info`), fetched once."""

    def __init__(self, client: AsyncPrivateClient, max_body_bytes: int) -> None:
        self.client = client
        self.max_body_bytes = max_body_bytes
        self.cached: dict[str, dict] = {}  # the node's own answers to the two GETs

    def routing_header(self) -> dict[str, str]:
        return {"x-traceless-routing": "concentrated" if self.client.routing.concentrated else "ok"}

    async def call(self, request: Request, path: str) -> Response:
        body = None
        if request.method == "POST":
            body = await read_json(request, self.max_body_bytes)
            if not isinstance(body, dict):
                raise ApiError(400, "the request body must be a JSON object")
        try:
            result = await self.client.request(path, body)
        except UpstreamError as exc:  # the node's (or a hop's) own error: passed on, not to be retried
            return JSONResponse(exc.body, status_code=exc.status, headers={**NO_RETRY, **self.routing_header()})
        except PrivateClientError as exc:
            raise path_failed(exc.cause, self.routing_header()) from None
        if isinstance(result, dict):
            return JSONResponse(result, headers=self.routing_header())
        return StreamingResponse(
            _ending_cleanly(result),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **self.routing_header()},
        )

    async def once(self, request: Request, path: str) -> Response:
        """A GET over the private path the first time; its answer afterwards."""
        if path not in self.cached:
            response = await self.call(request, path)
            if response.status_code != 200 or not isinstance(response, JSONResponse):
                return response
            self.cached[path] = json.loads(bytes(response.body))
        return JSONResponse(self.cached[path], headers=self.routing_header())

    def forward(self, r: OpenAIRoute) -> Handler:
        """The handler of an OpenAI route: over the private path; the GETs' answers (the node's own:
        it knows max_model_len) fetched once."""
        fetch = self.once if r.kind is RouteKind.INFO else self.call

        async def handler(request: Request) -> Response:
            return await fetch(request, r.path)

        return handler

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def status(self, request: Request) -> Response:
        return JSONResponse(self.client.status())


def create_proxy_app(client: AsyncPrivateClient, max_body_bytes: int = 4 * 2**20) -> Starlette:
    h = _Handlers(client, max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        client.start()  # the token wallet's schedule starts with the proxy, not with a request
        try:
            yield
        finally:
            await client.aclose()

    table = [
        *((r.path, r.name, h.forward(r), r.method) for r in OPENAI_ROUTES),
        ("/health", "health", h.health, "GET"),
        ("/status", "status", h.status, "GET"),
    ]
    routes = [
        Route(path, endpoint(COMPONENT, name, local_only(handler)), methods=[method])
        for path, name, handler, method in table
    ]
    app = create_app(COMPONENT, routes, lifespan=lifespan)
    app.state.private_client = client
    return app


NO_RETRY = {"x-should-retry": "false"}
_STATUS = {
    FailureCause.RELAY_UNREACHABLE: 503,
    FailureCause.NO_HEALTHY_NODE: 503,
    FailureCause.TOKENS_UNAVAILABLE: 503,
    FailureCause.QUOTA_EXHAUSTED: 429,
    FailureCause.TIMED_OUT: 504,
}
_MESSAGE = {
    FailureCause.RELAY_UNREACHABLE: "the relay could not be reached; nothing was sent",
    FailureCause.NO_HEALTHY_NODE: "no healthy, verifiable node serves this model now; nothing was sent",
    FailureCause.DUPLICATE_LISTING: "the gateway listed one node more than once; nothing was sent",
    FailureCause.TOKENS_UNAVAILABLE: "no token: the issuer, the transparency log or the gateway's challenge "
    "could not be used (GET /status, and the proxy's log, say more)",
    FailureCause.QUOTA_EXHAUSTED: "the token issuer's quota for this API key is used up for now",
    FailureCause.TOKEN_REFUSED: "the gateway refused this epoch's token; the request was not sent",
    FailureCause.NODE_FAILED: "the private path could not complete this request (a node or a hop failed after "
    "it was sent; it was not resent)",
    FailureCause.TIMED_OUT: "the private path went silent past its timeout; the request was abandoned",
}


def path_failed(cause: FailureCause, headers: dict[str, str] | None = None) -> ApiError:
    """The proxy's answer for a failure of this cause: a fixed message, never to be retried."""
    return ApiError(
        _STATUS.get(cause, 502),
        _MESSAGE[cause],
        type="upstream_error",
        code=cause.value,
        headers={**NO_RETRY, **(headers or {})},
    )


async def _ending_cleanly(events: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """The node's events; if the stream breaks off, an error event and [DONE] instead of a cut."""
    try:
        async for event in events:
            yield event
    except PrivateClientError as exc:
        error = path_failed(exc.cause)
        emit("http.error", component=COMPONENT, status_code=error.status, error_kind="upstream")
        yield b"data: " + json.dumps(error.body(), separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
