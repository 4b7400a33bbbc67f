"""What a request's output must match: plain data carried by SamplingParams (no llguidance here).

    json_object   any JSON object
    json_schema   a JSON Schema (source: the schema as JSON text)
    regex         a regular expression (Rust regex syntax)
    choice        one of a list of strings (source: the list as JSON text)
    grammar       a Lark or GBNF grammar (llguidance's dialect)

The source is request content: it is never logged, echoed in an error, or cached across requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from traceless.errors import InvalidRequestError

MAX_SOURCE_CHARS = 64 * 1024  # a schema or grammar larger than this is refused before compiling


class StructuredKind(Enum):
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    CHOICE = "choice"
    GRAMMAR = "grammar"


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    kind: StructuredKind
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, StructuredKind):
            raise InvalidRequestError("structured output kind must be a StructuredKind")
        if not isinstance(self.source, str):
            raise InvalidRequestError("a structured output's source must be a string")
        if len(self.source) > MAX_SOURCE_CHARS:
            raise InvalidRequestError(
                f"a structured output's schema or grammar may have at most {MAX_SOURCE_CHARS} characters"
            )
        if self.kind is not StructuredKind.JSON_OBJECT and not self.source:
            raise InvalidRequestError(f"a {self.kind.value} structured output needs a non-empty source")

    def __repr__(self) -> str:  # never the source itself
        return f"StructuredOutput(kind={self.kind.value}, chars={len(self.source)})"

    __str__ = __repr__
