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
    assert parse_all('<tool_call>{"name": "f", "argu')[1] == []  # cut by length: content


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
    msgs = [
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}],
        }
    ]
    (m,) = for_template(msgs, plain)
    assert m == {"role": "assistant", "content": 'ok<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'}
    assert parse_all(m["content"])[1][0].arguments == '{"x":1}'
    assert for_template(msgs, "{{ m.tool_calls }}") is msgs


def test_llama3_json_calls():
    from traceless.server.tools import ToolFormat, tool_format

    llama = ToolFormat.LLAMA3_JSON
    assert tool_format("{{ '<|python_tag|>' }} ipython") is llama
    assert tool_format("<tool_call> ipython") is ToolFormat.HERMES and tool_format(None) is ToolFormat.HERMES
    content, calls = parse_all(' {"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}', llama)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("f", '{"x":1}'), ("g", "{}")]
    assert parse_all('<|python_tag|>{"name": "f", "parameters": {}}', llama)[1][0].name == "f"
    assert parse_all("Hello {there}", llama) == ("Hello {there}", [])
    cut = '{"name": "f", "parameters": {}} trailing'
    assert parse_all(cut, llama) == (cut, [])


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(0, 80), max_size=6), lead=st.sampled_from(["", " ", "\n"]))
def test_llama3_pieces_reassemble(cuts, lead):
    from traceless.server.tools import ToolFormat, finish_parser, new_parser

    for text in (lead + '{"name": "f", "parameters": {"a": [1, 2]}}', lead + "plain words, no call"):
        points = sorted({min(c, len(text)) for c in cuts})
        p = new_parser(ToolFormat.LLAMA3_JSON)
        content, calls = "", []
        for a, b in zip([0, *points], [*points, len(text)]):
            c, found = p.feed(text[a:b])
            content, calls = content + c, calls + found
        rest, more = finish_parser(p)
        whole = parse_all(text, ToolFormat.LLAMA3_JSON)
        assert (content + rest, [(c.name, c.arguments) for c in calls + more]) == (
            whole[0],
            [(c.name, c.arguments) for c in whole[1]],
        )


def test_llama3_forced_grammar_accepts_its_calls(byte_model_dir):
    from traceless.model.tokenizer import Tokenizer
    from traceless.server.tools import ToolFormat
    from traceless.structured.grammar import GrammarCompiler

    tok = Tokenizer.from_hf_dir(byte_model_dir)
    compiler = GrammarCompiler(tok, 384)
    tools = [
        {
            "type": "function",
            "function": {
                "name": n,
                "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
            },
        }
        for n in ("a", "b")
    ]
    spec = forced_call_grammar(parse_tools(tools, "required", True, ToolFormat.LLAMA3_JSON))
    guide = compiler.guide(compiler.compile(spec))
    text = '{"name":"b","parameters":{"x":3}}; {"name":"a","parameters":{"x":-1}}'
    ids = tok.encode(text, add_special_tokens=False)
    assert guide.advance(ids) == len(ids)
    assert [c.name for c in parse_all(text, ToolFormat.LLAMA3_JSON)[1]] == ["b", "a"]
    bad = compiler.guide(compiler.compile(spec))
    assert bad.valid_prefix(tok.encode('{"name":"c"', add_special_tokens=False)) < len('{"name":"c"')


SMOL = (
    '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}},\n'
    '{"name": "get_time", "arguments": {"tz": "CET"}}\n]</tool_call>'
)


def test_smollm2_lists():
    content, calls = parse_all("Sure." + SMOL)
    assert content == "Sure."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"tz": "CET"}),
    ]
    assert parse_all("<tool_call>[]</tool_call>") == ("", [])  # SmolLM2's "no call needed"
    mixed = '<tool_call>[{"name": "f", "arguments": {}}, 3]</tool_call>'
    assert parse_all(mixed) == (mixed, [])  # not all calls: the model's text, as written


def test_smollm2_forced_grammar_matches_its_format():
    from traceless.server.tools import ToolFormat

    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    for parallel, many in ((None, True), (False, False)):
        g = forced_call_grammar(parse_tools(tools, "required", parallel, ToolFormat.SMOLLM2)).source
        assert g.startswith('start: "<tool_call>[\\n" call') and g.split("\n")[0].endswith('"\\n]</tool_call>"')
        assert ('(",\\n" call)*' in g) is many
