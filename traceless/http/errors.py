"""HTTP errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}.

Messages name fields and limits, never echo the values a client sent (a value may be user
content, and error bodies can end up in logs of intermediaries).
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from traceless.errors import (
    ContextLengthError,
    EngineDeadError,
    InvalidRequestError,
    ModelNotFoundError,
    QueueFullError,
    ShuttingDownError,
    TracelessError,
)

# Event error kinds (events.ERROR_KIND) for codes whose status alone would be ambiguous.
_KIND_BY_CODE = {
    "token_required": "token_invalid",
    "token_invalid": "token_invalid",
    "token_replayed": "token_replayed",
    "spent_set_full": "unavailable",
    "upstream_unreachable": "upstream",
    "upstream_timeout": "timeout",
    "unsupported_media_type": "invalid_request",
    "method_not_allowed": "invalid_request",
    "decapsulation_failed": "decrypt_failed",
    "queue_full": "queue_full",
    "unsupported_endpoint": "not_found",
}
_KIND_BY_STATUS = {
    400: "invalid_request",
    401: "unauthorized",
    403: "unauthorized",
    404: "not_found",
    413: "too_large",
    415: "invalid_request",
    429: "rate_limited",
    503: "unavailable",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def kind(self) -> str:
        """The events-schema error kind: by code where one is mapped, else by status."""
        return _KIND_BY_CODE.get(self.code or "", _KIND_BY_STATUS.get(self.status, "internal"))

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def internal_error() -> ApiError:
    return ApiError(500, "internal error", type="server_error")


def from_traceless_error(exc: TracelessError) -> ApiError:
    """Map a typed error from the engine or the library to its HTTP error (the message is ours,
    shaped, content-free)."""
    if isinstance(exc, ContextLengthError):
        return ApiError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return ApiError(400, str(exc))
    if isinstance(exc, QueueFullError):
        return ApiError(
            503,
            "the server is at capacity; retry later",
            type="server_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, ModelNotFoundError):
        return ApiError(404, str(exc), type="invalid_request_error", code="model_not_found")
    if isinstance(exc, EngineDeadError):
        return ApiError(503, "the engine has stopped", type="server_error", code="engine_dead")
    if isinstance(exc, ShuttingDownError):
        return ApiError(503, "the server is shutting down; retry on another", type="server_error", code="shutting_down")
    return internal_error()
