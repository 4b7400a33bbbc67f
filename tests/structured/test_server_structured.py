"""Structured outputs and tool calls over HTTP with the official openai client, on a tiny random
model whose tokenizer spells any byte."""

from __future__ import annotations

import json
import logging

import httpx
import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.support.serving import make_served_app, serve
from traceless.config import EngineConfig
from traceless.events import LOGGER_NAME

openai = pytest.importorskip("openai")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


class Person(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=150)
    admin: bool


@pytest.fixture(scope="module")
def server(byte_model_dir):
    app, engine = make_served_app(
        EngineConfig(model=str(byte_model_dir), dtype="float32", kv_cache_memory=2**22, max_model_len=1024),
        max_body_bytes=256 * 1024,
    )
    with serve(app, engine) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture
def captured_logs():
    """Every log record of the process while the test runs (the server runs in this process)."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler, root = Keep(level=logging.DEBUG), logging.getLogger()
    # an in-process command run by an earlier test (cli.main -> configure_logging) may have turned the
    # event logger's propagation off for the rest of the process: on for this test, then as it was
    events = logging.getLogger(LOGGER_NAME)
    old, old_propagate, old_disabled = root.level, events.propagate, events.disabled
    events.propagate, events.disabled = True, False
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        root.removeHandler(handler)
        root.setLevel(old)
        events.propagate, events.disabled = old_propagate, old_disabled


def test_parse_returns_a_validated_object(client, model, server):
    for seed in (0, 1):
        done = client.chat.completions.parse(
            model=model,
            messages=[{"role": "user", "content": "who?"}],
            response_format=Person,
            max_tokens=400,
            temperature=1.0,
            seed=seed,
        )
        choice = done.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Person)
        jsonschema.validate(json.loads(choice.message.content), Person.model_json_schema())
    server.check_integrity()


def test_completions_structured_outputs(client, model):
    r = client.completions.create(
        model=model,
        prompt="pick",
        max_tokens=20,
        n=3,
        temperature=1.0,
        seed=5,
        extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}},
    )
    assert {c.text for c in r.choices} <= {"red", "green", "blue"}
    r = client.completions.create(
        model=model, prompt="id", max_tokens=20, extra_body={"structured_outputs": {"regex": "[A-F]{4}-[0-9]{2}"}}
    )
    assert len(r.choices[0].text) == 7 and r.choices[0].text[4] == "-"
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    r = client.completions.create(
        model=model,
        prompt="x",
        max_tokens=30,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}},
    )
    jsonschema.validate(json.loads(r.choices[0].text), schema)


def test_streamed_structured_output_validates(client, model):
    schema = Person.model_json_schema()
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=400,
        stream=True,
        seed=2,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), schema)


def test_refusals_name_the_feature_and_echo_nothing(server, model, captured_logs):
    canary = "CANARY-schema-31337"
    bad = [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": canary, "schema": {"type": "object", "not": {"const": canary}}},
                }
            },
            "not",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "format": canary}},
                }
            },
            "format",
        ),
        ({"structured_outputs": {"regex": canary + "[a-"}}, None),
        ({"structured_outputs": {"grammar": canary + " ::= ::="}}, None),
        ({"structured_outputs": {"json": {"$ref": "#/" + canary}}}, None),
    ]
    for extra, feature in bad:
        r = httpx.post(
            server.url + "/v1/chat/completions",
            timeout=60,
            json={"model": model, "messages": [{"role": "user", "content": "x"}], **extra},
        )
        assert r.status_code == 400, r.text
        assert canary not in r.text
        if feature:
            assert feature in r.json()["error"]["message"]
    ok = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=60,
        json={
            "model": model,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 200,
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "description": canary,
                        "parameters": {"type": "object", "properties": {"v": {"const": canary}}, "required": ["v"]},
                    },
                }
            ],
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "seed": 0,
        },
    )
    assert ok.status_code == 200, ok.text
    args = json.loads(ok.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    assert args == {"v": canary}
    assert captured_logs and not [r for r in captured_logs if canary in r]
    server.check_integrity()


def test_forced_tool_call_round_trip(client, model, server):
    messages = [{"role": "user", "content": "weather in Paris?"}]
    r = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER, TIME],
        max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21"},
    ]
    answer = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER, TIME], max_tokens=8, tool_choice="none", temperature=0
    )
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].finish_reason in ("stop", "length")
    server.check_integrity()


def test_required_calls_validate_and_stream_the_same(client, model):
    kw = dict(
        model=model,
        messages=[{"role": "user", "content": "now"}],
        tools=[WEATHER, TIME],
        tool_choice="required",
        max_tokens=200,
        temperature=0,
    )
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.tool_calls
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for call in whole.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                acc = calls.setdefault(d.index, {"name": "", "arguments": ""})
                acc["name"] += d.function.name or ""
                acc["arguments"] += d.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.function.name, "arguments": c.function.arguments} for c in whole.message.tool_calls
    ]


def test_tool_messages_and_bad_tools(server, model):
    base = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    cases = [
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": [WEATHER, WEATHER]},
        {"tool_choice": "required"},
        {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
        {"messages": [{"role": "tool", "content": "x"}]},
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}
                    ],
                }
            ]
        },
    ]
    for extra in cases:
        r = httpx.post(server.url + "/v1/chat/completions", json={**base, **extra}, timeout=60)
        assert r.status_code == 400, (extra, r.text)
