"""Tokenizer and chat template, from GGUF metadata or a Hugging Face directory.

GGUF: byte-level BPE (`tokenizer.ggml.model == "gpt2"`) with the pre-tokenizer that
`tokenizer.ggml.pre` names, or SentencePiece-style BPE (`"llama"`) with merges derived from the
token scores. Chat templates are rendered in a sandboxed jinja2 environment.

Every tokenizer is built with its word cache off. `tokenizers` keeps, per model (BPE and Unigram),
up to 10,000 pre-tokenized words with their merges, never evicted (since 0.23 in each thread's
own map, for the life of the thread): on a server, words of prompts, system prompts, tool
descriptions and forced outputs would stay in memory long after their requests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from traceless.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError

if TYPE_CHECKING:
    from jinja2 import Template

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4


def _byte_level_pre(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("gpt2", "gpt-2"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False
    if pre == "smollm":
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        ), False
    if pre in ("llama-bpe", "llama3"):
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), "isolated"), byte_level]), True
    if pre == "qwen2":
        return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_QWEN2_SPLIT), "isolated"), byte_level]), False
    # "default" (or no name) means a different regex set in llama.cpp than in GPT-2: refuse rather than guess.
    raise UnsupportedModelError(f"unsupported GGUF pre-tokenizer {pre!r} (supported: gpt2, smollm, llama-bpe, qwen2)")


def _spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges of a SentencePiece vocabulary: every split of a piece into two known pieces,
    ranked by the merged piece's score (how SentencePiece BPE orders its merges)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for piece, score in zip(tokens, scores):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _gguf_backend(meta: dict) -> HFTokenizer:
    kind = meta.get("tokenizer.ggml.model")
    tokens = list(meta.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise ModelLoadError("GGUF metadata has no tokenizer vocabulary")
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
        pre, ignore_merges = _byte_level_pre(str(meta.get("tokenizer.ggml.pre", "(none)")))
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges, cache_capacity=0))
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
        unk = tokens[int(meta.get("tokenizer.ggml.unknown_token_id", 0))]
        tok = HFTokenizer(
            models.BPE(
                vocab=vocab,
                merges=_spm_merges(tokens, scores),
                unk_token=unk,
                byte_fallback=True,
                fuse_unk=True,
                cache_capacity=0,
            )
        )
        prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        tok.normalizer = normalizers.Sequence(
            ([normalizers.Prepend("\u2581")] if prefix else []) + [normalizers.Replace(" ", "\u2581")]
        )
        tok.decoder = decoders.Sequence(
            [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
            + ([decoders.Strip(" ", 1, 0)] if prefix else [])
        )
    else:
        raise UnsupportedModelError(f"unsupported GGUF tokenizer model {kind!r} (supported: gpt2, llama)")
    types = list(meta.get("tokenizer.ggml.token_type") or [])
    specials = [
        AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _TOKEN_CONTROL
    ]
    user = [
        AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == _TOKEN_USER_DEFINED
    ]
    tok.add_special_tokens(specials)
    if user:
        tok.add_tokens(user)
    return tok


def disable_word_cache(backend: HFTokenizer) -> None:
    """Turn off the model's word cache before it tokenizes anything. A capacity of zero stores
    nothing (BPE and Unigram check it before every insert); WordPiece and WordLevel keep none."""
    model = backend.model
    if isinstance(model, (models.WordPiece, models.WordLevel)):
        return
    if not isinstance(model, (models.BPE, models.Unigram)):
        raise UnsupportedModelError(f"unsupported tokenizer model {type(model).__name__}")
    try:
        model._resize_cache(0)
    except AttributeError:
        raise ModelLoadError("this version of tokenizers cannot turn off its word cache") from None


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str


class Tokenizer:
    def __init__(
        self,
        backend: HFTokenizer,
        *,
        bos_id: int | None,
        eos_ids: frozenset[int],
        add_bos: bool,
        chat_template: str | None,
    ):
        disable_word_cache(backend)
        self.backend = backend
        self.bos_id = bos_id
        self.eos_ids = eos_ids
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._template: Template | None = None  # compiled on first use (jinja2 is imported then)

    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> Tokenizer:
        bos = meta.get("tokenizer.ggml.bos_token_id")
        eos = meta.get("tokenizer.ggml.eos_token_id")
        eot = meta.get("tokenizer.ggml.eot_token_id")
        eos_ids = frozenset(int(x) for x in (eos, eot) if x is not None)
        # As llama.cpp: SentencePiece vocabularies and llama-bpe add BOS unless the file says otherwise.
        default_bos = meta.get("tokenizer.ggml.model") == "llama" or meta.get("tokenizer.ggml.pre") == "llama-bpe"
        return cls(
            _gguf_backend(meta),
            bos_id=None if bos is None else int(bos),
            eos_ids=eos_ids,
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", default_bos)),
            chat_template=meta.get("tokenizer.chat_template"),
        )

    @classmethod
    def from_hf_dir(cls, path: Path) -> Tokenizer:
        file = path / "tokenizer.json"
        if not file.is_file():
            raise ModelLoadError(f"{path} has no tokenizer.json")
        try:
            backend = HFTokenizer.from_file(str(file))
        except Exception as exc:
            raise ModelLoadError(f"tokenizer.json is not readable ({type(exc).__name__})") from None
        tcfg = _json_or_empty(path / "tokenizer_config.json")
        gen = _json_or_empty(path / "generation_config.json")
        model_cfg = _json_or_empty(path / "config.json")
        eos = gen.get("eos_token_id", model_cfg.get("eos_token_id"))
        eos_list = eos if isinstance(eos, list) else [eos] if eos is not None else []
        bos = gen.get("bos_token_id", model_cfg.get("bos_token_id"))
        template = tcfg.get("chat_template")
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        # BOS, when the model wants it, is added by tokenizer.json's post-processor.
        return cls(
            backend,
            bos_id=bos,
            eos_ids=frozenset(int(e) for e in eos_list),
            add_bos=False,
            chat_template=template if isinstance(template, str) else None,
        )

    def set_chat_template(self, template: str) -> None:
        """Use this template instead of the model's own; an invalid one fails here, not on a request."""
        try:
            compiled = _compile_template(template)
        except Exception as exc:
            raise ModelLoadError(f"the chat template is not valid Jinja ({type(exc).__name__})") from None
        self.chat_template, self._template = template, compiled

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def decode_stream(self, skip_special_tokens: bool = True) -> decoders.DecodeStream:
        return decoders.DecodeStream(skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """The conversation as the model's template writes it; `tools` (OpenAI tool objects) is the
        template's `tools` variable."""
        if self.chat_template is None:
            raise InvalidRequestError("this model has no chat template; use a plain completion instead")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise InvalidRequestError("each message needs a string 'role' and a string 'content'")
        if self._template is None:
            try:
                self._template = _compile_template(self.chat_template)
            except Exception:
                raise InvalidRequestError("this model's chat template is invalid and cannot render messages") from None
        special = {
            "bos_token": self.token_text(self.bos_id) if self.bos_id is not None else "",
            "eos_token": self.token_text(min(self.eos_ids)) if self.eos_ids else "",
        }
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, tools=tools, **special
            )
        except InvalidRequestError:
            raise
        except Exception as exc:
            raise InvalidRequestError(
                f"the chat template cannot render these messages ({type(exc).__name__})"
            ) from None


def _json_or_empty(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        raise ModelLoadError(f"{path.name} is not valid JSON") from None
    return data if isinstance(data, dict) else {}


def _compile_template(source: str) -> Template:
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class StrictSandbox(ImmutableSandboxedEnvironment):
        """Reading an unsafe attribute raises instead of rendering as an empty string."""

        def unsafe_undefined(self, obj, attribute):
            raise SecurityError(f"access to attribute {attribute!r} is not allowed in a chat template")

    def raise_exception(message: str):
        # Templates build this message from the conversation ("unexpected role " + role, ...):
        # it would echo client text, so the error says only that the template refused.
        raise InvalidRequestError("the chat template refused this conversation")

    env = StrictSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env.from_string(source)
