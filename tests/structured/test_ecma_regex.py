"""JSON Schema `pattern` is an ECMA-262 regular expression, where `\\d` is [0-9], `\\w` is
[A-Za-z0-9_] and `\\s` is a fixed set of spaces; llguidance reads `\\d` and `\\w` as Unicode classes
(a pattern `\\d{3}` once let a model write three Arabic-Indic digits). Patterns and regex outputs are
translated before llguidance sees them; outputs must match Python's `re` in ASCII mode."""

from __future__ import annotations

import json
import re

import pytest

from traceless.entrypoints.llm import LLM
from traceless.errors import InvalidRequestError
from traceless.sampling_params import SamplingParams
from traceless.structured.ecma_regex import ecma_to_ascii
from traceless.structured.spec import StructuredKind, StructuredOutput


@pytest.fixture(scope="module")
def llm(byte_model_dir):
    return LLM(str(byte_model_dir), dtype="float32", kv_cache_memory=2**21, max_model_len=256)


def _accepts(llm, spec: StructuredOutput, text: str) -> bool:
    compiler = llm.engine.grammar
    ids = llm.get_tokenizer().encode(text, add_special_tokens=False)
    guide = compiler.guide(compiler.compile(spec))
    try:
        return guide.valid_prefix(ids) == len(ids)
    finally:
        guide.release()


NON_ASCII = {"digit": "\u0663", "word": "\u00e9", "space": "\u3000"}  # Arabic-Indic 3, e-acute, ideographic space


def _spec(kind: StructuredKind, pattern: str) -> StructuredOutput:
    if kind is StructuredKind.REGEX:
        return StructuredOutput(kind, pattern.strip("^$"))
    return StructuredOutput(kind, json.dumps({"type": "string", "pattern": pattern}))


def _text(kind: StructuredKind, text: str) -> str:
    return text if kind is StructuredKind.REGEX else json.dumps(text, ensure_ascii=False)


@pytest.mark.parametrize("kind", [StructuredKind.REGEX, StructuredKind.JSON_SCHEMA])
@pytest.mark.parametrize(
    "pattern, ascii_text, other, ecma_accepts",
    [
        (r"^\d{3}$", "123", NON_ASCII["digit"] * 3, False),
        (r"^\d{3}$", "123", "\U0001fbf8" * 3, False),  # segmented digits
        (r"^\w+$", "a_Z9", "a" + NON_ASCII["word"], False),
        (r"^[\d-]+$", "1-2", "1-" + NON_ASCII["digit"], False),
        (r"^\D$", "x", NON_ASCII["digit"], True),  # not one of [0-9]
        (r"^a\sb$", "a\tb", "a" + NON_ASCII["space"] + "b", True),  # ECMA's \s includes the Zs spaces
    ],
)
def test_classes_mean_what_ecma_262_says(llm, kind, pattern, ascii_text, other, ecma_accepts):
    spec = _spec(kind, pattern)
    assert _accepts(llm, spec, _text(kind, ascii_text))
    assert _accepts(llm, spec, _text(kind, other)) == ecma_accepts


def test_regex_outputs_use_ascii_classes(llm):
    spec = StructuredOutput(StructuredKind.REGEX, r"\d{3}-\w{2}")
    assert _accepts(llm, spec, "123-a_")
    assert not _accepts(llm, spec, NON_ASCII["digit"] * 3 + "-ab")
    params = SamplingParams(max_tokens=40, temperature=1.5, seed=3, structured=spec)
    for out in llm.generate(["x", "y", "z", "w"], params, use_tqdm=False):
        assert re.fullmatch(r"\d{3}-\w{2}", out.outputs[0].text, re.ASCII), out.outputs[0].text
    schema = {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": r"^\d{2}\w$"}},
        "required": ["id"],
        "additionalProperties": False,
    }
    params = SamplingParams(
        max_tokens=60,
        temperature=1.5,
        seed=5,
        structured=StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(schema)),
    )
    for out in llm.generate(["x", "y"], params, use_tqdm=False):
        text = out.outputs[0].text
        if out.outputs[0].finish_reason == "stop":
            assert re.fullmatch(r"\d{2}\w", json.loads(text)["id"], re.ASCII), text
    llm.engine.check_integrity()


@pytest.mark.parametrize(
    "source, expected",
    [
        (r"\d", "[0-9]"),
        (r"\D", "[^0-9]"),
        (r"\w", "[A-Za-z0-9_]"),
        (r"\W", "[^A-Za-z0-9_]"),
        (r"[\d_]", "[0-9_]"),
        (r"[^\w]", "[^A-Za-z0-9_]"),
        (r"\\d", r"\\d"),
        (r"[\]\d]", r"[\]0-9]"),
        (r"a\.b", r"a\.b"),
        (r"\p{L}", r"\p{L}"),
    ],
)
def test_the_translation(source, expected):
    assert ecma_to_ascii(source) == expected


def test_negated_classes_inside_a_set_are_refused():
    with pytest.raises(InvalidRequestError, match="negated class"):
        ecma_to_ascii(r"[\D]")
