import io
import json
import logging

import pytest

from traceless import events
from traceless.events import EventSchemaError, emit


@pytest.fixture
def captured():
    stream = io.StringIO()
    logger = logging.getLogger(events.LOGGER_NAME)
    handler = logging.StreamHandler(stream)
    old_level, old_prop = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(old_level)
    logger.propagate = old_prop


def test_emit_writes_one_json_line(captured):
    emit("request.finished", finish="stop", prompt_tokens=12, output_tokens=3, ttft_s=0.1, e2e_s=0.5)
    record = json.loads(captured.getvalue().strip())
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
def test_schema_rejects_anything_undeclared(captured, event, fields):
    with pytest.raises(EventSchemaError):
        emit(event, **fields)
    assert captured.getvalue() == ""


def test_schema_has_no_free_text_fields():
    for event, fields in events.SCHEMA.items():
        for name, kind in fields.items():
            assert kind in (int, float, bool) or isinstance(kind, events.Choice), (event, name)
