"""A tiny random model whose tokenizer covers every byte (so any JSON can be spelled), with a
Hermes-style chat template that renders tools (the shape Qwen2.5 uses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import make_tiny_model

TOOLS_TEMPLATE = (
    "{% if tools %}<s>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n{% endif %}"
    "# Tools\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    'Call a tool as <tool_call>{"name": ..., "arguments": ...}</tool_call></s>\n'
    "{% elif messages[0]['role'] == 'system' %}<s>system\n{{ messages[0]['content'] }}</s>\n{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
    "{% if m['role'] == 'tool' %}<s>user\n<tool_response>\n{{ m['content'] }}\n</tool_response></s>\n"
    "{% elif m['role'] == 'assistant' and m.get('tool_calls') %}<s>assistant\n{{ m['content'] or '' }}"
    "{% for c in m['tool_calls'] %}<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": "
    "{{ c['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}</s>\n"
    "{% else %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def write_byte_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TOOLS_TEMPLATE}))


@pytest.fixture(scope="session")
def byte_model_dir(tmp_path_factory) -> Path:
    path = make_tiny_model(tmp_path_factory.mktemp("tiny-bytes"), "llama", seed=3, max_position_embeddings=1024)
    write_byte_tokenizer(path)
    return path
