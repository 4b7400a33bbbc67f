"""Tokenizers built from GGUF metadata: the default model's byte-level BPE and chat template agree
with what transformers builds from the same file; synthetic byte-level and SentencePiece ("llama")
vocabularies agree with transformers where it follows llama.cpp, and follow llama.cpp where it
does not; bad vocabularies and templates raise typed errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.model.gguf_helpers import CONTROL, NORMAL, Vocab, bytes_to_unicode, write_vocab_gguf
from traceless.errors import InvalidRequestError, ModelLoadError, TracelessError, UnsupportedModelError
from traceless.model.gguf_loader import read_metadata
from traceless.model.tokenizer import Tokenizer

CORPUS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "1234567890 3.14159265358979 98765432109876543210 x=10_000_000+42",
    "def f(x):\n    if x:\n        return x * 2  # double\n    return None\n",
    "a    b     c\n\n\n\nd\t\te\r\nf   ",
    "   leading and trailing spaces   ",
    "\t\tindented\twith\ttabs\n\t}",
    "café naïve résumé Ångström Ünïcödé",
    "日本語のテキスト、中文字符。한국어 텍스트",
    "🤖👍🏽 family: 👨\u200d👩\u200d👧 flag 🇫🇷",
    "don't, I'll, we're, it's, O'Brien's, DON'T, you'VE",
    "‘curly’ “quotes” — and… ellipses",
    "nbsp\u00a0zero\u200bwidth\ufeffbom",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text <|im_end|>",
    "<|im_start|><|im_end|><|endoftext|>",
    "not special: <|im_start |> <im_start> |im_end|",
    "Mixed 42 tokens, ümlauts & 漢字 in one line; then\n\n  code(1, 2)",
    "word " * 200,
]
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


def plain(text: str) -> bool:
    return not any(s in text for s in SPECIALS)


@pytest.fixture(scope="module")
def real_meta(default_model_path) -> dict:
    import gguf

    return read_metadata(gguf.GGUFReader(str(default_model_path)))


@pytest.fixture(scope="module")
def ours(real_meta) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(real_meta)


@pytest.fixture(scope="module")
def hf(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path.parent, gguf_file=default_model_path.name)


def hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def our_tokenizer(path: Path) -> Tokenizer:
    import gguf

    return Tokenizer.from_gguf_metadata(read_metadata(gguf.GGUFReader(str(path))))


def pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.token_text(i) for i in ids]


# --------------------------------------------------------------------------------------------
# the default model (byte-level BPE, pre-tokenizer "smollm")


@pytest.mark.slow
def test_default_tokenizer_encodes_like_transformers(ours, hf):
    assert ours.vocab_size == len(hf) == 49152
    assert (ours.bos_id, ours.eos_ids, ours.add_bos) == (1, frozenset({2}), False)
    for add_special in (True, False):
        wrong = [s for s in CORPUS if ours.encode(s, add_special) != hf.encode(s, add_special_tokens=add_special)]
        assert wrong == []
    # special tokens in the text are matched whole, not spelled out
    assert ours.encode("<|im_start|>user") == [1, *ours.encode("user")]


@pytest.mark.slow
def test_default_tokenizer_decodes_like_transformers(ours, hf):
    for text in CORPUS:
        ids = ours.encode(text)
        assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False) == text
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
        if plain(text):
            assert ours.decode(ids) == text
    assert ours.decode(ours.encode("a<|im_end|>b")) == "ab"  # specials dropped by default


def stream_decode(tok: Tokenizer, ids: list[int], skip_special_tokens: bool) -> list[str]:
    stream = tok.decode_stream(skip_special_tokens)
    return [stream.step(tok.backend, i) or "" for i in ids]


@pytest.mark.slow
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_stream_reproduces_decode(ours, skip_special_tokens):
    split_chars = 0
    for text in CORPUS:
        ids = ours.encode(text)
        parts = stream_decode(ours, ids, skip_special_tokens)
        assert "".join(parts) == ours.decode(ids, skip_special_tokens=skip_special_tokens), text
        assert all("\ufffd" not in p for p in parts)  # never emits half a character
        split_chars += sum("\ufffd" in ours.decode([i]) for i in ids)
    # the corpus really splits multi-byte characters across tokens (emoji, CJK, Hangul)
    assert split_chars > 10


@pytest.mark.slow
def test_decode_stream_waits_for_the_rest_of_a_character(ours):
    ids = ours.encode("🤖")
    assert len(ids) > 1  # one 4-byte character, several byte tokens
    parts = stream_decode(ours, ids, True)
    assert parts[:-1] == [""] * (len(ids) - 1) and parts[-1] == "🤖"


CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "Line one\nline two\twith tab, café, 日本, 🤖"},
    ],
    [{"role": "user", "content": ""}],
]


@pytest.mark.slow
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_chat_template_renders_like_transformers(ours, hf, conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation]
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    got = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert got == want
    assert got.endswith("<|im_start|>assistant\n") == add_generation_prompt
    assert ours.encode(got, add_special_tokens=False) == hf.encode(want, add_special_tokens=False)


# Exercises what SmolLM's own template does not: trim_blocks/lstrip_blocks on an indented
# template, filters, loop controls (break), tojson, and the special-token variables.
TEMPLATE = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] == 'system' %}
<<SYS>>{{ message['content'] | trim }}<</SYS>>
    {% else %}
[{{ message['role'] | upper }}] {{ message['content'] }}{% if not loop.last %} |{% endif %}

    {% endif %}
    {% if message['content'] == 'STOP' %}{% break %}{% endif %}
{% endfor %}
{{ messages | map(attribute='role') | join(',') }} {{ messages[0] | tojson }}
{{ messages | tojson(indent=2) }}
{% if add_generation_prompt %}
[ASSISTANT]{{ eos_token }}
{% endif %}"""


@pytest.mark.slow
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_custom_template_renders_like_transformers(ours, hf, conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation] + [{"role": "user", "content": "STOP"}, {"role": "user", "content": "never"}]
    tok = Tokenizer(ours.backend, bos_id=ours.bos_id, eos_ids=ours.eos_ids, add_bos=False, chat_template=TEMPLATE)
    want = hf.apply_chat_template(
        messages, chat_template=TEMPLATE, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == want
    assert "[USER] never" not in want and want.startswith("<|im_start|>")


# --------------------------------------------------------------------------------------------
# synthetic byte-level BPE vocabularies, one per pre-tokenizer

_B = bytes_to_unicode()
SP, NL, TAB = _B[ord(" ")], _B[ord("\n")], _B[ord("\t")]  # "Ġ", "Ċ", "ĉ"
BPE_MERGES = [
    f"{SP} t",
    "h e",
    f"{SP}t he",
    f"{SP} a",
    "i n",
    f"{SP} {SP}",
    f"{SP}{SP} {SP}",
    f"{NL} {NL}",
    "1 2",
    "12 3",
    f"{SP} 1",
    f"{SP}1 2",
    "' s",
    "' t",
    "' S",
    f"{SP} (",
    ") :",
    f"{TAB} {TAB}",
    "e r",
    f"{SP} w",
    "o r",
    f"{SP}w or",
    "l d",
    f"{SP}wor ld",
    f"{SP}{SP} {NL}",
    f"{SP} '",
    f"{SP}' s",
    f"{SP} h",
    f"{SP}h e",
    "l l",
    f"{SP}he ll",
    f"{SP}hell o",
    "c a",
    "ca f",
    "é s",
]
BPE_CORPUS = [
    "the world",
    "Hello   world\n\n\nx",
    "123456 1234",
    " 12 x",
    "it's IT'S 'twas",
    "def f(x):\n\t\treturn  1\n",
    "  \n  y",
    "café 日本語 🤖",
    "a<|im_start|>b",
    "x  \n\n",
    " (hello) : the",
    "\r\n\r\n",
    "   ",
]


def byte_level(pre: str, extra_tokens: tuple[str, ...] = ()) -> Vocab:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + list(_B.values()) + [m.replace(" ", "") for m in BPE_MERGES] + list(extra_tokens)
    types = [CONTROL] * len(specials) + [NORMAL] * (len(tokens) - len(specials))
    return Vocab("gpt2", tokens, types, merges=BPE_MERGES, pre=pre, bos_id=0, eos_id=0)


@pytest.mark.parametrize("pre", ["gpt2", "gpt-2", "llama-bpe", "qwen2"])
def test_byte_level_pre_tokenizers_match_transformers(tmp_path, pre):
    path = write_vocab_gguf(tmp_path / "bpe.gguf", byte_level(pre))
    ours, hf = our_tokenizer(path), hf_tokenizer(path)
    for text in BPE_CORPUS:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == hf.encode(text, add_special_tokens=False), (pre, text, pieces(ours, ids))
        assert ours.decode(ids, skip_special_tokens=False) == text


def test_pre_tokenizers_really_differ(tmp_path):
    """The corpus above tells the pre-tokenizers apart (so the test above checks each regex)."""
    encodings = {}
    for pre in ["gpt2", "llama-bpe", "qwen2", "smollm"]:
        tok = our_tokenizer(write_vocab_gguf(tmp_path / f"{pre}.gguf", byte_level(pre)))
        encodings[pre] = [tuple(tok.encode(t, add_special_tokens=False)) for t in BPE_CORPUS]
    assert len(set(map(tuple, encodings.values()))) == 4


def test_smollm_isolates_digits_like_llama_cpp(tmp_path):
    """llama.cpp's smollm pre-tokenizer splits every digit off first (regex "\\p{N}", then GPT-2's),
    so merges such as "1 2" never apply. (transformers' GGUF loader uses plain GPT-2 splitting here
    and would give "12"/"123"; the default model's vocabulary has no multi-digit tokens, so the two
    agree on it.)"""
    tok = our_tokenizer(write_vocab_gguf(tmp_path / "smollm.gguf", byte_level("smollm")))
    assert pieces(tok, tok.encode("123 12")) == ["1", "2", "3", SP, "1", "2"]
    assert pieces(tok, tok.encode(" the world")) == [f"{SP}the", f"{SP}world"]


def test_llama_bpe_takes_whole_words_from_the_vocabulary(tmp_path):
    """Llama 3 ("llama-bpe") ignores merges for a pre-token that is itself a token (llama.cpp sets
    ignore_merges for it); GPT-2 style BPE spells it out through the merges."""
    extra = (f"{SP}zebra",)  # in the vocabulary, no merges lead to it
    llama3 = our_tokenizer(write_vocab_gguf(tmp_path / "l3.gguf", byte_level("llama-bpe", extra)))
    gpt2 = our_tokenizer(write_vocab_gguf(tmp_path / "g2.gguf", byte_level("gpt2", extra)))
    assert pieces(llama3, llama3.encode(" zebra", add_special_tokens=False)) == [f"{SP}zebra"]
    assert pieces(gpt2, gpt2.encode(" zebra", add_special_tokens=False)) == [SP, "z", "e", "b", "r", "a"]


# --------------------------------------------------------------------------------------------
# a synthetic SentencePiece ("llama") vocabulary

SPM_MERGED = [  # best first: score -index
    "he",
    "ll",
    "▁t",
    "▁a",
    "▁h",
    "▁w",
    "in",
    "er",
    "▁the",
    "or",
    "ld",
    "▁he",
    "llo",
    "▁hel",
    "▁hello",
    "▁wor",
    "▁world",
    "an",
    "nd",
    "▁and",
    "▁in",
    "re",
    "on",
    "es",
    "at",
    "▁is",
    "is",
    "▁s",
    "st",
    "▁st",
]
SPM_CHARS = list("etaohlnsrdwicumgpfyb.,!?'") + ["▁"]


def spm_vocab() -> Vocab:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["<|im_start|>"] + SPM_MERGED + SPM_CHARS
    types = [2, CONTROL, CONTROL] + [6] * 256 + [CONTROL] + [NORMAL] * (len(SPM_MERGED) + len(SPM_CHARS))
    scores = [0.0] * 260 + [-float(i) for i in range(len(SPM_MERGED))] + [-1000.0 - i for i in range(len(SPM_CHARS))]
    return Vocab("llama", tokens, types, scores=scores, bos_id=1, eos_id=2, unk_id=0)


# No leading whitespace and no special tokens inside: see test_spm_prefix_space_follows_llama_cpp.
SPM_CORPUS = [
    "hello world",
    "the hello",
    "and in the world",
    "this is the test",
    "Hello World!",
    "héllo",
    "日本",
    "🤖!",
    "a\nb",
    "two  spaces",
    "trailing ",
    "x",
    "",
]


@pytest.mark.parametrize("add_bos", [True, False])
def test_spm_matches_transformers(tmp_path, add_bos):
    path = write_vocab_gguf(tmp_path / "spm.gguf", spm_vocab(), {"add_bos_token": add_bos})
    ours, hf = our_tokenizer(path), hf_tokenizer(path)
    for text in SPM_CORPUS:
        ids = ours.encode(text)
        assert ids == hf.encode(text), (text, pieces(ours, ids))
        assert (ids[:1] == [1]) == add_bos
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True) == text
    # byte fallback: characters outside the vocabulary become their UTF-8 bytes
    assert pieces(ours, ours.encode("日", add_special_tokens=False)) == ["▁", "<0xE6>", "<0x97>", "<0xA5>"]
    assert pieces(ours, ours.encode("hello world", add_special_tokens=False)) == ["▁hello", "▁world"]


def test_spm_adds_bos_when_the_file_does_not_say(tmp_path):
    """llama.cpp adds BOS to a SentencePiece vocabulary unless tokenizer.ggml.add_bos_token says
    otherwise; so does transformers."""
    path = write_vocab_gguf(tmp_path / "spm.gguf", spm_vocab())
    ours, hf = our_tokenizer(path), hf_tokenizer(path)
    assert hf.encode("hello world")[0] == 1
    assert ours.encode("hello world") == hf.encode("hello world")


def test_spm_prefix_space_follows_llama_cpp(tmp_path):
    """SentencePiece (add_dummy_prefix) and llama.cpp prepend one "▁" to every text fragment, also
    to text that already starts with a space and to text right after a special token. transformers'
    GGUF conversion differs on exactly these (Metaspace with prepend_scheme="first": " hello" ->
    ["▁hello"] and "hello<|im_start|>world" -> [..., "w", "or", "ld"]), and cannot round-trip " hello"."""
    path = write_vocab_gguf(tmp_path / "spm.gguf", spm_vocab(), {"add_bos_token": False})
    tok = our_tokenizer(path)
    assert pieces(tok, tok.encode(" hello")) == ["▁", "▁hello"]
    assert pieces(tok, tok.encode("  the")) == ["▁", "▁", "▁the"]
    assert pieces(tok, tok.encode("hello<|im_start|>world")) == ["▁hello", "<|im_start|>", "▁world"]
    for text in (" hello", "  the", "   "):
        assert tok.decode(tok.encode(text)) == text


def test_spm_honours_add_space_prefix_false(tmp_path):
    """tokenizer.ggml.add_space_prefix = false (llama.cpp honours it) means no "▁" is prepended."""
    path = write_vocab_gguf(tmp_path / "spm.gguf", spm_vocab(), {"add_bos_token": False, "add_space_prefix": False})
    tok = our_tokenizer(path)
    assert pieces(tok, tok.encode("hello world")) == ["he", "llo", "▁world"]
    assert tok.decode(tok.encode("hello world")) == "hello world"


# --------------------------------------------------------------------------------------------
# unsupported or broken vocabularies


def tiny_meta(**changes) -> dict:
    vocab = byte_level("gpt2")
    meta = {
        "tokenizer.ggml.model": vocab.model,
        "tokenizer.ggml.pre": vocab.pre,
        "tokenizer.ggml.tokens": vocab.tokens,
        "tokenizer.ggml.token_type": vocab.token_types,
        "tokenizer.ggml.merges": vocab.merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }
    meta.update(changes)
    return {k: v for k, v in meta.items() if v is not None}


def test_tiny_meta_builds():
    tok = Tokenizer.from_gguf_metadata(tiny_meta())
    assert tok.decode(tok.encode("the world")) == "the world"


@pytest.mark.parametrize("model", ["bert", "t5", "rwkv", "no_vocab"])
def test_unsupported_tokenizer_model_is_named(model):
    with pytest.raises(UnsupportedModelError, match=f"'{model}'"):
        Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.ggml.model": model}))


@pytest.mark.parametrize("pre", ["deepseek-llm", "falcon", "tekken", "chatglm-bpe"])
def test_unsupported_pre_tokenizer_is_named(pre):
    with pytest.raises(UnsupportedModelError, match=f"'{pre}'"):
        Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.ggml.pre": pre}))


def test_missing_vocabulary_is_a_load_error():
    with pytest.raises(ModelLoadError, match="vocabulary"):
        Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.ggml.tokens": None}))
    with pytest.raises(ModelLoadError, match="vocabulary"):
        Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.ggml.tokens": []}))


# --------------------------------------------------------------------------------------------
# chat template errors and the sandbox

USER = [{"role": "user", "content": "hi"}]


def with_template(source: str) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(tiny_meta(**{"tokenizer.chat_template": source}))


def test_template_raise_exception_is_invalid_request():
    tok = with_template(
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message comes first') }}{% endif %}"
    )
    with pytest.raises(InvalidRequestError, match="the chat template refused this conversation"):
        tok.apply_chat_template(USER)
    assert tok.apply_chat_template([{"role": "system", "content": "x"}]) == ""


def test_template_raise_exception_never_carries_the_templates_text():
    """Templates build their messages from the conversation ('unexpected role ' + role, ...): the
    error says that the template refused, never what it said."""
    tok = with_template("{{ raise_exception('cannot handle: ' + messages[0]['content']) }}")
    with pytest.raises(InvalidRequestError) as info:
        tok.apply_chat_template([{"role": "user", "content": "PRIVATE-CANARY-31f2"}])
    assert "PRIVATE-CANARY" not in str(info.value) and "cannot handle" not in str(info.value)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user"}],
        [{"content": "hi"}],
        [{"role": "user", "content": None}],
        [{"role": "user", "content": 5}],
        [{"role": 1, "content": "hi"}],
        ["user: hi"],
    ],
)
def test_malformed_messages_are_invalid_request(messages):
    tok = with_template("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    with pytest.raises(InvalidRequestError, match="role.*content"):
        tok.apply_chat_template(messages)


def test_no_template_is_invalid_request():
    with pytest.raises(InvalidRequestError, match="no chat template"):
        Tokenizer.from_gguf_metadata(tiny_meta()).apply_chat_template(USER)


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ raise_exception.__globals__.os }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{% set _ = messages.append({'role': 'x', 'content': 'y'}) %}",
        "{% set _ = messages[0].update({'content': 'changed'}) %}",
    ],
)
def test_sandbox_blocks_escapes_and_mutation(source):
    tok = with_template(source)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidRequestError):
        tok.apply_chat_template(messages)
    assert messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__ }}",
        "{{ messages.__class__ }}",
        "{{ messages[0].__init__ }}",
        "{{ raise_exception.__globals__ }}",
    ],
)
def test_sandbox_refuses_unsafe_attribute_access(source):
    """Reading an unsafe attribute must raise, not quietly render as an empty string."""
    with pytest.raises(InvalidRequestError):
        with_template(source).apply_chat_template(USER)


def test_template_syntax_error_is_typed():
    with pytest.raises(TracelessError):
        with_template("{% for m in messages %}{{ m['content'] }}").apply_chat_template(USER)  # no endfor


def test_template_sees_special_tokens_and_generation_flag():
    tok = with_template("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ messages|length }}")
    assert tok.apply_chat_template(USER, add_generation_prompt=False) == "<|endoftext|>|<|endoftext|>|False|1"
