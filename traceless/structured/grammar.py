"""Compile a StructuredOutput with llguidance and hold one request's matcher.

    GrammarCompiler(tokenizer, vocab_size)      one per model; its llguidance tokenizer is built once
        .compile(spec) -> CompiledGrammar        validates; raises InvalidRequestError (a 400)
        .guide(compiled) -> Guide                a fresh matcher for one engine request

Compiling is bounded: the source is at most MAX_SOURCE_CHARS, a JSON schema nests at most
MAX_SCHEMA_DEPTH levels, and llguidance runs under LIMITS (lexer fuel, grammar size, Earley items),
so a pathological schema is refused, not compiled for minutes. JSON is generated compact
(no free whitespace), so a schema whose strings, numbers and arrays are bounded yields a bounded
output. Errors never carry llguidance's message (it quotes the schema): a refusal names at most
JSON Schema keywords from a fixed list, which are schema vocabulary, not client text.

A compiled grammar and a matcher are request content: nothing here caches them; the engine drops
the Guide when its request ends (`release`). llguidance tokenizes through the model's own
tokenizer, whose word cache is off (structured/ll_tokenizer.py).
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from traceless.errors import InvalidRequestError
from traceless.structured.ecma_regex import ecma_to_ascii
from traceless.structured.ll_tokenizer import build_ll_tokenizer
from traceless.structured.spec import StructuredKind, StructuredOutput

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLTokenizer
    from llguidance._lib import JsonCompileOptions

    from traceless.model.tokenizer import Tokenizer

MAX_SCHEMA_DEPTH = 32
MAX_CHOICES = 256
# JSON output is compact and strict: a schema's own "x-guidance" options cannot loosen it.
_JSON_OVERRIDES: JsonCompileOptions = {"whitespace_flexible": False, "lenient": False}
_SCHEMA_WORDS = frozenset(
    {
        "$ref",
        "$defs",
        "definitions",
        "$id",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "dependentSchemas",
        "dependentRequired",
        "dependencies",
        "properties",
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
        "propertyNames",
        "required",
        "minProperties",
        "maxProperties",
        "items",
        "prefixItems",
        "additionalItems",
        "unevaluatedItems",
        "contains",
        "minContains",
        "maxContains",
        "minItems",
        "maxItems",
        "uniqueItems",
        "type",
        "enum",
        "const",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    }
)


def _limits():
    from llguidance import LLParserLimits

    return LLParserLimits(
        max_items_in_row=2000,
        initial_lexer_fuel=1_000_000,
        step_lexer_fuel=200_000,
        step_max_items=50_000,
        max_lexer_states=50_000,
        max_grammar_size=200_000,
        verbose_errors=False,
    )


@dataclass(frozen=True, slots=True)
class CompiledGrammar:
    """llguidance's grammar for one request (request content: never logged or cached)."""

    kind: StructuredKind
    grammar: str

    def __repr__(self) -> str:
        return f"CompiledGrammar(kind={self.kind.value})"

    __str__ = __repr__


class Guide:
    """One engine request's grammar matcher: the token mask at the current position, advanced
    with every accepted token. Not thread-safe; the engine thread owns it."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher: LLMatcher):
        self._matcher: LLMatcher | None = matcher

    @property
    def matcher(self) -> LLMatcher:
        if self._matcher is None:
            raise RuntimeError("the guide was released")
        return self._matcher

    def fill_mask(self, address: int, nbytes: int) -> None:
        """Write the allowed-token bitmask (int32 words, bit t % 32 of word t // 32) at `address`."""
        self.matcher.unsafe_compute_mask_ptr(address, nbytes)

    def accept(self, token_id: int) -> bool:
        return self.matcher.consume_token(token_id)

    def advance(self, token_ids: list[int]) -> int:
        """Consume the longest valid prefix of token_ids; returns how many were consumed."""
        return self.matcher.try_consume_tokens(token_ids)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and not self.matcher.rollback(num_tokens):
            raise RuntimeError("the grammar matcher could not roll back")

    def valid_prefix(self, token_ids: list[int]) -> int:
        """How many leading tokens of token_ids the grammar allows next (nothing is consumed)."""
        return self.matcher.validate_tokens(token_ids)

    @property
    def is_stopped(self) -> bool:
        """The grammar is complete and admits no further token."""
        return self.matcher.is_stopped()

    @property
    def failed(self) -> bool:
        return self.matcher.is_error()

    def release(self) -> None:
        self._matcher = None

    def __repr__(self) -> str:
        return "Guide()"


class GrammarCompiler:
    """Compiles StructuredOutputs for one model's tokenizer. Thread-safe (the server compiles on
    its preparation threads, the offline engine on its own)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        self.vocab_size = max(vocab_size, tokenizer.vocab_size)
        self._lock = threading.Lock()
        self._ll: LLTokenizer | None = None

    def _ll_tokenizer(self) -> LLTokenizer:
        with self._lock:
            if self._ll is None:
                eos = sorted(self._tokenizer.eos_ids)
                if not eos:
                    raise InvalidRequestError("this model has no end-of-sequence token; structured outputs need one")
                # tokenizes through the model's tokenizer: no word cache of llguidance's own
                self._ll = build_ll_tokenizer(self._tokenizer, self.vocab_size, eos)
            return self._ll

    def compile(self, spec: StructuredOutput) -> CompiledGrammar:
        grammar = _grammar(spec)
        self._build(spec.kind, grammar)  # validates under the limits; the matcher is dropped
        return CompiledGrammar(spec.kind, grammar)

    def guide(self, compiled: CompiledGrammar) -> Guide:
        return Guide(self._build(compiled.kind, compiled.grammar))

    def _build(self, kind: StructuredKind, grammar: str) -> LLMatcher:
        from llguidance import LLMatcher

        matcher = LLMatcher(self._ll_tokenizer(), grammar, log_level=0, limits=_limits())
        if matcher.is_error():
            raise _refusal(kind, matcher.get_error())
        return matcher


def _grammar(spec: StructuredOutput) -> str:
    from llguidance import LLMatcher

    kind = spec.kind
    if kind is StructuredKind.JSON_OBJECT:
        return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OVERRIDES)
    if kind is StructuredKind.JSON_SCHEMA:
        schema = _json(spec.source, "the JSON schema")
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequestError("the JSON schema must be an object")
        if schema is False:
            raise InvalidRequestError("the JSON schema false admits no output")
        _check_depth(schema)
        return LLMatcher.grammar_from_json_schema(
            schema if isinstance(schema, dict) else {"type": "object"}, overrides=_JSON_OVERRIDES
        )
    if kind is StructuredKind.REGEX:
        # ECMA-262's \d \w \s, as in JSON Schema patterns (llguidance's regex syntax reads them as Unicode)
        return LLMatcher.grammar_from_regex(ecma_to_ascii(spec.source))
    if kind is StructuredKind.CHOICE:
        choices = _json(spec.source, "the choice list")
        if (
            not isinstance(choices, list)
            or not choices
            or len(choices) > MAX_CHOICES
            or not all(isinstance(c, str) and c for c in choices)
        ):
            raise InvalidRequestError(f"a choice must be a list of 1 to {MAX_CHOICES} non-empty strings")
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    return _lark(spec.source)


def _lark(source: str) -> str:
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(source)  # GBNF is converted; Lark passes through
    except Exception:
        raise InvalidRequestError("the grammar is neither valid Lark nor valid GBNF") from None
    return LLMatcher.grammar_from_lark(lark)


def _json(source: str, what: str) -> Any:
    try:
        return json.loads(source)
    except (ValueError, RecursionError):
        raise InvalidRequestError(f"{what} is not valid JSON") from None


def _check_depth(schema: Any) -> None:
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise InvalidRequestError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


_UNIMPLEMENTED = re.compile(r'"([A-Za-z$]+)"')


def _refusal(kind: StructuredKind, message: str) -> InvalidRequestError:
    """A 400 for a grammar llguidance refused, without its message (which quotes the source)."""
    what = {
        StructuredKind.JSON_SCHEMA: "JSON schema",
        StructuredKind.JSON_OBJECT: "JSON schema",
        StructuredKind.REGEX: "regex",
        StructuredKind.CHOICE: "choice list",
    }.get(kind, "grammar")
    if message.startswith("Unimplemented keys"):
        known = sorted({k for k in _UNIMPLEMENTED.findall(message) if k in _SCHEMA_WORDS})
        if known:
            return InvalidRequestError(f"the JSON schema uses unsupported feature(s): {', '.join(known)}")
        return InvalidRequestError("the JSON schema uses unsupported keywords")
    if message.startswith("Unknown format"):
        return InvalidRequestError("the JSON schema uses an unsupported string 'format'")
    lowered = message.lower()
    if any(w in lowered for w in ("limit", "fuel", "too many", "too large", "too big", "exceeded")):
        return InvalidRequestError(f"the {what} is too complex to compile within this server's limits")
    return InvalidRequestError(f"the {what} is invalid or uses an unsupported feature")
