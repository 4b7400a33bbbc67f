"""Why a call over the private path failed, as a fixed cause the proxy turns into an HTTP answer.

Each cause names a class of failure the user can act on (the relay is down, the quota is used up,
no node could be verified) without anything a hop could use: no node id, address or upstream text.
"""

from __future__ import annotations

from enum import Enum


class FailureCause(Enum):
    RELAY_UNREACHABLE = "relay_unreachable"  # the relay did not accept a connection: nothing was sent
    NO_HEALTHY_NODE = "no_healthy_node"  # the gateway listed no node, or none that verified
    DUPLICATE_LISTING = "duplicate_listing"  # the gateway listed one node under several ids
    TOKENS_UNAVAILABLE = "tokens_unavailable"  # the wallet could not get tokens (issuer, log, challenge)
    QUOTA_EXHAUSTED = "quota_exhausted"  # the issuer's per-user quota is used up for now
    TOKEN_REFUSED = "token_refused"  # the gateway refused a token the client holds for this epoch
    NODE_FAILED = "private_path_failed"  # a node or a hop failed after the request was sent
    TIMED_OUT = "upstream_timeout"  # the node or a hop went silent past a timeout; not resent


class PrivateClientError(Exception):
    """The private path could not complete the call; `cause` says which class of failure."""

    def __init__(self, message: str, cause: FailureCause = FailureCause.NODE_FAILED) -> None:
        super().__init__(message)
        self.cause = cause


class PathTimeoutError(PrivateClientError):
    """The node or a hop went silent past a timeout; the request was abandoned (not resent)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, FailureCause.TIMED_OUT)


class UpstreamError(PrivateClientError):
    """The node answered with an OpenAI-style error (status and JSON body, already decrypted)."""

    def __init__(self, status: int, body: dict):
        super().__init__(f"node answered HTTP {status}")
        self.status, self.body = status, body
