"""No structured-output path hands request text to Python's `re`: its module-level cache keeps the
last few hundred patterns compiled (request content that would outlive the request). Every kind
is compiled and guided, and the refusals taken, with canary words in the source."""

from __future__ import annotations

import json
import re

import pytest

from traceless.errors import InvalidRequestError
from traceless.model.tokenizer import Tokenizer
from traceless.server.tools import ToolRequest, forced_call_grammar
from traceless.structured.grammar import GrammarCompiler
from traceless.structured.spec import StructuredKind, StructuredOutput
from traceless_tools.audit.canary import new_canary


def _specs(text: str, words: tuple[str, ...]) -> list[StructuredOutput]:
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "description": text,
            "parameters": {"type": "object", "properties": {"v": {"const": text}}, "required": ["v"]},
        },
    }
    forced = forced_call_grammar(ToolRequest([tool], "required", parallel=False))
    assert forced is not None
    return [
        StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps({"const": text, "pattern": re.escape(words[0])})),
        StructuredOutput(StructuredKind.REGEX, re.escape(text) + r"\d+"),
        StructuredOutput(StructuredKind.CHOICE, json.dumps([text, "other"])),
        StructuredOutput(StructuredKind.GRAMMAR, f"start: {json.dumps(text)} | /{words[0]}[0-9]/"),
        forced,
    ]


def _refused(text: str, words: tuple[str, ...]) -> list[StructuredOutput]:
    return [
        StructuredOutput(StructuredKind.REGEX, f"({re.escape(text)}"),  # unbalanced
        StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps({"const": text, words[1]: 1, "format": words[0]})),
        StructuredOutput(StructuredKind.GRAMMAR, f"start: {words[0]} ::="),
    ]


def _cached_patterns() -> list[str]:
    caches = [getattr(re, name, {}) for name in ("_cache", "_cache2")]
    return [str(key) for cache in caches for key in cache]


def test_no_structured_path_leaves_request_text_in_pythons_regex_cache(byte_model_dir):
    tok = Tokenizer.from_hf_dir(byte_model_dir)
    compiler = GrammarCompiler(tok, tok.vocab_size)
    canary = new_canary()
    for spec in _specs(canary.text, canary.words):
        guide = compiler.guide(compiler.compile(spec))
        guide.matcher.compute_ff_tokens()
        guide.release()
    for spec in _refused(canary.text, canary.words):
        with pytest.raises(InvalidRequestError):
            compiler.compile(spec)
    held = [p for p in _cached_patterns() if any(w in p or w.lower() in p.lower() for w in canary.words)]
    assert held == []
