"""Structured outputs through the offline engine: masks in the sampler, the matcher advanced with
every token, the output valid, the guide dropped at release."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from traceless.entrypoints.llm import LLM
from traceless.errors import InvalidRequestError
from traceless.sampling_params import SamplingParams
from traceless.structured.spec import StructuredKind, StructuredOutput

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(byte_model_dir):
    return LLM(str(byte_model_dir), dtype="float32", kv_cache_memory=2**21, max_model_len=256)


def _params(kind, source="", **kw):
    return SamplingParams(max_tokens=200, structured=StructuredOutput(kind, source), **kw)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_validates(llm, temperature):
    outs = llm.generate(
        ["hello", "w", "{"],
        _params(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA), temperature=temperature, seed=7),
        use_tqdm=False,
    )
    for o in outs:
        c = o.outputs[0]
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), SCHEMA)
    llm.engine.check_integrity()


def test_json_object_regex_choice_grammar(llm):
    # any object: a random model may write one string forever, so only the shape of a cut output is checked
    obj = llm.generate(
        "x",
        SamplingParams(
            max_tokens=40, temperature=0.0, ignore_eos=True, structured=StructuredOutput(StructuredKind.JSON_OBJECT)
        ),
        use_tqdm=False,
    )[0].outputs[0]
    assert obj.text.startswith("{")
    if obj.finish_reason == "stop":
        assert isinstance(json.loads(obj.text), dict)
    rx = llm.generate("x", _params(StructuredKind.REGEX, r"[0-9]{3}-[a-z]{2}"), use_tqdm=False)[0].outputs[0]
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", rx.text)
    ch = llm.generate(
        "x", _params(StructuredKind.CHOICE, '["yes", "no", "maybe"]', temperature=1.0, seed=1), use_tqdm=False
    )[0].outputs[0]
    assert ch.text in ("yes", "no", "maybe")
    gr = llm.generate("x", _params(StructuredKind.GRAMMAR, 'root ::= "(" [a-c]+ ")" | "none"'), use_tqdm=False)[
        0
    ].outputs[0]
    assert re.fullmatch(r"\([a-c]+\)|none", gr.text)
    llm.engine.check_integrity()


def test_logprobs_are_finite(llm):
    out = llm.generate("x", _params(StructuredKind.CHOICE, '["yes", "no"]', logprobs=5), use_tqdm=False)[0]
    for lp in out.outputs[0].logprobs:
        assert all(v.logprob > float("-inf") for v in lp.values())


def test_unsupported_schema_names_the_feature(llm):
    with pytest.raises(InvalidRequestError, match="unsupported feature\\(s\\): not$"):
        llm.generate(
            "x", _params(StructuredKind.JSON_SCHEMA, json.dumps({"not": {"const": "SECRET-VALUE"}})), use_tqdm=False
        )
    with pytest.raises(InvalidRequestError) as exc:
        llm.generate("x", _params(StructuredKind.REGEX, "SECRET[a-"), use_tqdm=False)
    assert "SECRET" not in str(exc.value)
    llm.engine.check_integrity()


def test_guide_is_released_with_the_request(llm):
    engine = llm.engine
    params = _params(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA))
    engine.add_request("r1", "hello", params)
    guide = engine._requests["r1"].guide
    assert guide is not None
    engine.step()
    engine.abort("r1")
    with pytest.raises(RuntimeError, match="released"):
        guide.fill_mask(0, 0)
    engine.check_integrity()


def test_guide_accepts_only_the_grammar(llm):
    compiler = llm.engine.grammar
    tok = llm.get_tokenizer()
    ok = compiler.guide(compiler.compile(StructuredOutput(StructuredKind.JSON_OBJECT)))
    ids = tok.encode('{"a":[1,2,{"b":null}]}', add_special_tokens=False)
    assert ok.advance(ids) == len(ids) and ok.is_stopped
    bad = compiler.guide(compiler.compile(StructuredOutput(StructuredKind.JSON_OBJECT)))
    assert bad.valid_prefix(tok.encode('{"a" 1}', add_special_tokens=False)) == 4
    assert bad.valid_prefix(tok.encode("[1]", add_special_tokens=False)) == 0


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_speculative_decoding_keeps_the_grammar(llm, byte_model_dir, mode):
    """Drafts are checked against the grammar: greedy output equals plain decoding's, and is valid."""
    spec = LLM(
        str(byte_model_dir),
        dtype="float32",
        kv_cache_memory=2**21,
        max_model_len=256,
        speculative=mode,
        num_speculative_tokens=3,
        draft_layers=1 if mode == "draft" else None,
        ngram_min=1,
    )
    prompts = ["hello", '{"name":"w","age":1', "[[["]
    params = _params(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA), temperature=0.0)
    plain = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
    fast = [o.outputs[0].text for o in spec.generate(prompts, params, use_tqdm=False)]
    assert fast == plain
    for text in fast:
        jsonschema.validate(json.loads(text), SCHEMA)
    sampled = spec.generate(
        prompts, _params(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA), temperature=1.0, seed=3), use_tqdm=False
    )
    for o in sampled:
        jsonschema.validate(json.loads(o.outputs[0].text), SCHEMA)
    assert spec.engine.spec_stats.proposed > 0
    spec.engine.check_integrity()


def test_guided_and_free_rows_share_a_batch(llm):
    free = SamplingParams(max_tokens=12, temperature=0.0)
    guided = _params(StructuredKind.REGEX, "[a-c]{5}", temperature=0.0)
    alone = llm.generate(["p", "q"], free, use_tqdm=False)
    mixed = llm.generate(["p", "x", "q", "y"], [free, guided, free, guided], use_tqdm=False)
    assert [mixed[0].outputs[0].text, mixed[2].outputs[0].text] == [o.outputs[0].text for o in alone]
    assert all(len(mixed[i].outputs[0].text) == 5 and set(mixed[i].outputs[0].text) <= set("abc") for i in (1, 3))
    llm.engine.check_integrity()


def test_async_scheduling_keeps_guided_output(llm, byte_model_dir):
    """A guided request needs its tokens on the host: with asynchronous scheduling the engine runs
    its steps synchronously, and a plain request in the same batch gives the same tokens."""
    ahead = LLM(str(byte_model_dir), dtype="float32", kv_cache_memory=2**21, max_model_len=256, async_scheduling=True)
    params = [
        _params(StructuredKind.JSON_SCHEMA, json.dumps(SCHEMA), temperature=1.0, seed=3),
        SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
    ]
    want = [o.outputs[0].token_ids for o in llm.generate(["hi", "x"], params, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in ahead.generate(["hi", "x"], params, use_tqdm=False)]
    assert got == want
    ahead.engine.check_integrity()
