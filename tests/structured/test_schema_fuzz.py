"""Schema fuzzing: random schemas inside the supported subset always yield output that parses and
validates; a schema using a feature outside it gets a refusal naming that feature; pathological
schemas are refused or compiled within bounded time."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceless.entrypoints.llm import LLM
from traceless.errors import InvalidRequestError
from traceless.sampling_params import SamplingParams
from traceless.structured.grammar import MAX_SCHEMA_DEPTH
from traceless.structured.spec import StructuredKind, StructuredOutput

UNSUPPORTED = {
    "not": {},
    "if": {"type": "string"},
    "dependentRequired": {"a": ["b"]},
    "uniqueItems": True,
    "contains": {"type": "integer"},
    "propertyNames": {"maxLength": 2},
    "unevaluatedProperties": False,
}


@st.composite
def ranges(draw):
    lo = draw(st.integers(-50, 50))
    return {"type": "integer", "minimum": lo, "maximum": lo + draw(st.integers(0, 200))}


# Bounded leaves: compact JSON of a bounded schema has a bounded length, so generation must stop.
LEAVES = st.one_of(
    ranges(),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 4)),
    st.builds(
        lambda vs: {"enum": vs},
        st.lists(st.one_of(st.text("abc", max_size=3), st.integers(0, 9)), min_size=1, max_size=4, unique=True),
    ),
    st.builds(lambda v: {"const": v}, st.text("xyz", max_size=3)),
)


def _object(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}


SCHEMAS = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.builds(_object, st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), inner, max_size=3)),
        st.builds(lambda s, n: {"type": "array", "items": s, "maxItems": n}, inner, st.integers(0, 2)),
        st.builds(lambda a, b: {"anyOf": [a, b]}, inner, inner),
    ),
    max_leaves=5,
)


@pytest.fixture(scope="module")
def llm(byte_model_dir):
    return LLM(str(byte_model_dir), dtype="float32", kv_cache_memory=2**22, max_model_len=1024)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(schema=SCHEMAS, seed=st.integers(0, 1000))
def test_supported_schemas_always_yield_valid_json(llm, schema, seed):
    structured = StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(schema))
    params = [SamplingParams(max_tokens=900, temperature=t, seed=seed, structured=structured) for t in (0.0, 1.0)]
    for out in llm.generate(["a", "b"], params, use_tqdm=False):
        c = out.outputs[0]
        assert c.finish_reason == "stop", (schema, c.text)
        jsonschema.validate(json.loads(c.text), schema)
    llm.engine.check_integrity()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, feature=st.sampled_from(sorted(UNSUPPORTED)), secret=st.text(min_size=6, max_size=12))
def test_unsupported_features_are_named(llm, schema, feature, secret):
    bad = {"type": "object", "properties": {"p": schema, "q": {"const": secret}}, feature: UNSUPPORTED[feature]}
    with pytest.raises(InvalidRequestError) as exc:
        llm.engine.grammar.compile(StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(bad)))
    message = str(exc.value)
    assert feature in message and "unsupported" in message
    assert secret not in message.replace(feature, "")


def test_pathological_schemas_are_bounded(llm):
    deep: dict = {"type": "integer"}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"type": "array", "items": deep}
    huge_enum = {"enum": [f"v{i:05d}" for i in range(5000)]}
    wide = {
        "anyOf": [
            _object({f"k{j}": {"type": "string", "pattern": f"[a-z]{{{j % 7 + 1}}}x+"} for j in range(12)})
            for _ in range(40)
        ]
    }
    for schema in (deep, huge_enum, wide, {"type": "string", "pattern": "(a|aa)*(b{1,900}){1,900}c"}):
        t0 = time.monotonic()
        try:
            compiled = llm.engine.grammar.compile(StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(schema)))
            llm.engine.grammar.guide(compiled)
        except InvalidRequestError as exc:
            assert "schema" in str(exc)
        assert time.monotonic() - t0 < 10.0
    out = llm.generate("x", SamplingParams(max_tokens=5, temperature=0.0), use_tqdm=False)  # still serving
    assert out[0].outputs[0].token_ids
