"""Typed errors raised at traceless's boundaries.

Messages describe the *shape* of what was wrong (a field name, a count, a limit), never user
content: an error message may reach logs or another component, and must carry no prompt text or
token ids.
"""

from __future__ import annotations


class TracelessError(Exception):
    """Base class of every error traceless raises on purpose."""


class ConfigError(TracelessError, ValueError):
    """A command's configuration cannot be used: an option's value, the model, a port, a directory.
    The command line prints it as one line and exits with status 2."""


class InvalidRequestError(TracelessError, ValueError):
    """A request or parameter is malformed or out of range (HTTP 400)."""


class ContextLengthError(InvalidRequestError):
    """The prompt (plus the requested output) does not fit the model's context (HTTP 400)."""


class ModelNotFoundError(TracelessError, FileNotFoundError):
    """A model path does not exist or a served model name is unknown (HTTP 404)."""


class ModelLoadError(TracelessError):
    """A model file exists but cannot be loaded: corrupt, truncated or inconsistent."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture, tokenizer or tensor format is not one traceless runs."""


class QueueFullError(TracelessError):
    """The engine holds as many requests as it accepts (HTTP 503 with Retry-After)."""


class RequestAbortedError(TracelessError):
    """The request was aborted before it finished (client disconnect or explicit abort)."""


class EngineDeadError(TracelessError):
    """The engine's step loop stopped; no further requests can run."""


class ShuttingDownError(TracelessError):
    """The server is stopping and ended the request (its drain time ran out, or the operator
    pressed Ctrl-C twice); HTTP 503."""


class KVRestoreError(TracelessError):
    """A preempted request's sealed KV could not be restored (its spill data is missing, truncated
    or fails authentication): that request fails; every other request goes on."""


class KVSpillError(TracelessError):
    """A request being preempted could not have its KV sealed and spilled (the offload directory is
    full or cannot be written): that request fails; every other request goes on."""
