"""The issuer's directory-only listener (`traceless issuer --directory-port`).

The gateway needs the issuer's public key and nothing else from it. On a second port the issuer
serves GET /token-issuer-directory and answers 404 to everything else, so a network policy can
let the gateway reach that port and not the one that signs tokens (deploy/k8s, docs/deploy.md).
Which port a request came in on is the server's own socket address in the ASGI scope, not
anything the client sends.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from traceless.events import emit
from traceless.http.errors import ApiError
from traceless_tools.cluster.issuer_directory import DIRECTORY_PATH

COMPONENT = "issuer"


class DirectoryOnlyPort:
    """Wraps the issuer app: requests arriving on `directory_port` reach only the directory."""

    __slots__ = ("_app", "_port")

    def __init__(self, app: ASGIApp, directory_port: int) -> None:
        self._app = app
        self._port = directory_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") if scope["type"] == "http" else None
        on_directory_port = server is not None and server[1] == self._port
        if on_directory_port and (scope["path"] != DIRECTORY_PATH or scope["method"] != "GET"):
            emit("http.request", component=COMPONENT, route="other", status_code=404)
            error = ApiError(404, "this port serves only GET /token-issuer-directory", code="not_found")
            await error.response()(scope, receive, send)
            return
        await self._app(scope, receive, send)
