"""The Hermes tool-call parser: whole outputs and the same outputs fed in arbitrary pieces."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from traceless.server.tools import HermesParser, forced_call_grammar, parse_all, parse_tools

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_whole_outputs():
    content, calls = parse_all("Let me check." + CALL)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    content, calls = parse_all(CALL + "\n" + CALL.replace("Paris", "Oslo"))
    assert content == "" and [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Oslo"]
    assert parse_all("no calls < here <tool") == ("no calls < here <tool", [])
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_all(broken) == (broken, [])  # not a call: it stays the model's text
    assert parse_all("<tool_call>{\"name\": \"f\", \"argu")[1] == []  # cut by length: content


@settings(max_examples=60, deadline=None)
@given(prefix=st.text(max_size=20), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_pieces_reassemble(prefix, cuts):
    text = prefix + CALL + "tail" + CALL
    whole_content, whole_calls = parse_all(text)
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    p = HermesParser()
    content, calls = "", []
    for piece in pieces:
        c, found = p.feed(piece)
        content += c
        calls += found
    content += p.finish()
    assert content.strip() == whole_content.strip()
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]


def test_forced_grammars():
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("a", "b")]
    assert forced_call_grammar(parse_tools(tools, "auto", None)) is None
    named = forced_call_grammar(parse_tools(tools, {"type": "function", "function": {"name": "b"}}, None))
    assert named is not None and '"const":"b"' in named.source and '"const":"a"' not in named.source
    one = forced_call_grammar(parse_tools(tools, "required", False))
    many = forced_call_grammar(parse_tools(tools, "required", True))
    assert one is not None and many is not None and "call)*" in many.source and "call)*" not in one.source


def test_templates_without_tools():
    import pytest

    from traceless.http.errors import ApiError
    from traceless.server.tools import check_template, for_template

    tools = [{"type": "function", "function": {"name": "f"}}]
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ApiError):
        check_template(parse_tools(tools, "auto", None), plain)
    check_template(parse_tools(tools, "required", None), plain)  # enforced by the grammar
    check_template(parse_tools(tools, "auto", None), "{{ tools }}")
    msgs = [{"role": "assistant", "content": "ok", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]
    (m,) = for_template(msgs, plain)
    assert m == {"role": "assistant", "content": 'ok<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'}
    assert parse_all(m["content"])[1][0].arguments == '{"x":1}'
    assert for_template(msgs, "{{ m.tool_calls }}") is msgs
