"""llguidance's tokenizer, tokenizing with the model's own (word-cache-free) tokenizer.

Built from tokenizer.json, llguidance would run its own copy of `tokenizers`, with that library's
default word cache: every word of a schema `const`, a regex literal, a choice or a forced tool call
it tokenizes would stay in the cache for the life of the process. Instead llguidance is given the
token table and a callable: each string it needs tokenized goes to `Tokenizer.backend`, which
stores nothing (model/tokenizer.py).

The token table (each id's bytes, which ids are special) comes from a throwaway llguidance
tokenizer built from tokenizer.json, which decodes byte-level and SentencePiece pieces exactly as
llguidance expects; it never sees request text and is dropped once the table is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from llguidance import LLTokenizer
    from llguidance._tokenizer import TokenizerWrapper
    from tokenizers import Tokenizer as HFTokenizer

    from traceless.model.tokenizer import Tokenizer


class _Encoder:
    """The object llguidance calls to tokenize (its `TokenizerWrapper` protocol): the attributes
    below, and `__call__(text) -> ids`. Called from llguidance's Rust code, so it must not raise
    (an exception there is a panic): encoding a str cannot fail."""

    is_tokenizer_wrapper = True

    def __init__(self, backend: HFTokenizer, tokens: list[bytes], special: list[int], eos: int, bos: int | None):
        self._backend = backend
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = eos
        self.bos_token_id = bos

    def __call__(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids


def build_ll_tokenizer(tokenizer: Tokenizer, vocab_size: int, eos: list[int]) -> LLTokenizer:
    from llguidance import LLTokenizer

    table = LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=eos)
    n = table.vocab_size
    tokens = [table.decode_bytes([i]) for i in range(n)]
    special = [i for i in range(n) if table.is_special_token(i)]
    del table
    encoder = _Encoder(tokenizer.backend, tokens, special, eos[0], tokenizer.bos_id)
    # llguidance reads the protocol's attributes; its own TokenizerWrapper class is not required
    return LLTokenizer(cast("TokenizerWrapper", encoder), n_vocab=vocab_size, eos_token=eos)
