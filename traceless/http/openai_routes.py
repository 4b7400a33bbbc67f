"""The OpenAI-compatible routes, written once: `traceless serve`, the node (inside OHTTP) and the
client's local proxy all serve exactly these.

Plain data, no handlers: each front binds a route's `name` to its own work (the server's and the
node's to `OpenAIService.handlers()`, the proxy's to a call over the private path).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class RouteKind(Enum):
    GENERATION = "generation"  # POST JSON -> JSON or an SSE stream; counted in the telemetry windows
    TOKENS = "tokens"  # POST JSON -> JSON (vLLM's tokenizer calls)
    INFO = "info"  # GET -> the same JSON for every caller (the model list, the tokenizer's description)


@dataclass(frozen=True, slots=True)
class OpenAIRoute:
    path: str
    name: str  # the endpoint's name in events and telemetry, and the key of its handler
    kind: RouteKind

    @property
    def method(self) -> str:
        return "GET" if self.kind is RouteKind.INFO else "POST"


OPENAI_ROUTES: tuple[OpenAIRoute, ...] = (
    OpenAIRoute("/v1/models", "models", RouteKind.INFO),
    OpenAIRoute("/v1/completions", "completions", RouteKind.GENERATION),
    OpenAIRoute("/v1/chat/completions", "chat_completions", RouteKind.GENERATION),
    OpenAIRoute("/tokenize", "tokenize", RouteKind.TOKENS),
    OpenAIRoute("/detokenize", "detokenize", RouteKind.TOKENS),
    OpenAIRoute("/tokenizer_info", "tokenizer_info", RouteKind.INFO),
)
BY_PATH: dict[str, OpenAIRoute] = {r.path: r for r in OPENAI_ROUTES}
