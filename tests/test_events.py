import json

import pytest

from traceless import events
from traceless.events import EventSchemaError, emit


def test_emit_writes_one_json_line(captured_events):
    emit("request.finished", finish="stop", prompt_tokens=12, output_tokens=3, ttft_s=0.1, e2e_s=0.5)
    record = json.loads(captured_events.text().strip())
    assert record["event"] == "request.finished"
    assert record["finish"] == "stop" and record["prompt_tokens"] == 12


@pytest.mark.parametrize(
    "event, fields",
    [
        ("no.such.event", {}),
        ("request.finished", {"prompt": "hello"}),  # undeclared field
        ("request.finished", {"finish": "because the user said so"}),  # not one of the choices
        ("request.finished", {"prompt_tokens": "12"}),  # text where a number is declared
        ("request.finished", {"prompt_tokens": True}),  # bool is not an int here
        ("request.finished", {"ttft_s": float("nan")}),
        ("http.request", {"stream": 1}),
    ],
)
def test_schema_rejects_anything_undeclared(captured_events, event, fields):
    with pytest.raises(EventSchemaError):
        emit(event, **fields)
    assert captured_events.text() == ""


def test_schema_has_no_free_text_fields():
    for event, fields in events.SCHEMA.items():
        for name, kind in fields.items():
            assert kind in (int, float, bool) or isinstance(kind, events.Choice), (event, name)
