"""The built-in model's tools template, and --chat-template."""

import pytest

from traceless.errors import ModelLoadError
from traceless.model.gguf_loader import _reader, read_metadata
from traceless.model.loader import builtin_chat_template, default_model_path
from traceless.model.tokenizer import Tokenizer
from traceless.server.tools import ToolFormat, tool_format

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and?"},
    ],
    [{"role": "user", "content": "a"}, {"role": "system", "content": "late system"}],
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def gguf_tokenizer():
    return Tokenizer.from_gguf_metadata(read_metadata(_reader(default_model_path())))


def test_without_tools_it_renders_exactly_as_the_models_own(gguf_tokenizer):
    own = Tokenizer.from_gguf_metadata(read_metadata(_reader(default_model_path())))
    tools_tok = Tokenizer.from_gguf_metadata(read_metadata(_reader(default_model_path())))
    tools_tok.set_chat_template(builtin_chat_template("smollm2-tools"))
    assert tools_tok.chat_template != own.chat_template
    for messages in CONVERSATIONS:
        for gen in (True, False):
            assert tools_tok.apply_chat_template(messages, gen) == own.apply_chat_template(messages, gen)


def test_with_tools_it_writes_smollm2s_format(gguf_tokenizer):
    tok = gguf_tokenizer
    tok.set_chat_template(builtin_chat_template("smollm2-tools"))
    assert tool_format(tok.chat_template) is ToolFormat.SMOLLM2
    text = tok.apply_chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        tools=[WEATHER],
    )
    assert text.startswith("<|im_start|>system\nYou are an expert in composing functions.")
    assert '<tools>[{"name": "get_weather", "description": "Weather in a city"' in text
    assert "\n\nBe brief.<|im_end|>\n" in text and text.count("<|im_start|>system") == 1
    assert (
        '<|im_start|>assistant\n<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n]'
        "</tool_call><|im_end|>\n"
    ) in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_built_in_model_gets_it_and_an_explicit_template_wins(tmp_path):
    from traceless.config import EngineConfig
    from traceless.runner.build import build_engine_parts

    parts = build_engine_parts(EngineConfig(dtype="float32", kv_cache_memory=16 << 20, max_model_len=256))
    assert parts.tokenizer.chat_template == builtin_chat_template("smollm2-tools")
    mine = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    parts = build_engine_parts(
        EngineConfig(dtype="float32", kv_cache_memory=16 << 20, max_model_len=256, chat_template=mine)
    )
    assert parts.tokenizer.apply_chat_template([{"role": "user", "content": "x"}]) == "[user]x"


def test_an_invalid_template_fails_at_load_not_on_a_request(gguf_tokenizer):
    with pytest.raises(ModelLoadError, match="not valid Jinja"):
        gguf_tokenizer.set_chat_template("{% for m in messages %}")
    with pytest.raises(ModelLoadError):
        builtin_chat_template("nope")


def test_cli_reads_the_file_and_the_node_measures_it(tmp_path):
    import argparse

    from traceless.cli.engine_args import add_engine_args, engine_options

    p = argparse.ArgumentParser()
    add_engine_args(p)
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0]['content'] }}")
    assert engine_options(p.parse_args(["--chat-template", str(f)]))["chat_template"] == f.read_text()
    assert engine_options(p.parse_args([]))["chat_template"] is None
    with pytest.raises(SystemExit, match="--chat-template"):
        engine_options(p.parse_args(["--chat-template", str(tmp_path / "missing")]))
