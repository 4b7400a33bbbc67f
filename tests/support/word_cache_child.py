"""A process that tokenizes a canary the way a node does, then waits to have its memory searched.

    python -m tests.support.word_cache_child DIR

DIR holds `gguf_meta.json` (a `tokenizer.ggml.*` vocabulary), `bpe/` and `unigram/` (tokenizer.json
directories). The canary arrives hex-encoded on stdin (read with os.read: no long-lived buffer keeps
it). On long-lived threads, as the server's preparation threads do, every tokenizer encodes it and
the grammar compiler compiles a JSON schema `const`, a regex, a choice and a Lark grammar holding it, with each
guide's forced tokens computed: each on a thread of its own, so no later work on the same thread
overwrites what an earlier one left in its stack. Then everything is dropped, collected and each
thread scrubbed as an idle server does (its malloc cache and dead stack overwritten), and the
process prints "ready" and sleeps.
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from traceless.model.tokenizer import Tokenizer
from traceless.server.thread_cache import scrub_thread
from traceless.structured.grammar import GrammarCompiler
from traceless.structured.spec import StructuredKind, StructuredOutput


def write_tokenizers(root: Path) -> None:
    """Three small tokenizers of the kinds a node loads: a GGUF byte-level BPE vocabulary, a
    tokenizer.json byte-level BPE and a tokenizer.json Unigram (SentencePiece-style, `▁`)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    from traceless_tools.audit.canary import BYTE_LEVEL, CYRILLIC, LATIN

    symbols = [BYTE_LEVEL[b] for b in range(256)]
    merges = [f"Ġ {c}" for c in LATIN] + [f"{a} {b}" for a in "qjxaeiou" for b in "qjxaeiou"]
    tokens = ["<unk>", "<s>", "</s>", *symbols, *(m.replace(" ", "") for m in merges)]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 3),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    (root / "gguf_meta.json").write_text(json.dumps(meta))
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = HFTokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(["<s>", "</s>"])
    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("\u2581", -1.0)]
    pieces += [(c, -2.0) for c in LATIN + CYRILLIC]
    unigram = HFTokenizer(models.Unigram(pieces, unk_id=0))
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    unigram.decoder = decoders.Metaspace()
    for name, tok in (("bpe", bpe), ("unigram", unigram)):
        (root / name).mkdir()
        tok.save(str(root / name / "tokenizer.json"))
        (root / name / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))


def load(root: Path) -> list[Tokenizer]:
    meta = json.loads((root / "gguf_meta.json").read_text())
    return [
        Tokenizer.from_gguf_metadata(meta),
        Tokenizer.from_hf_dir(root / "bpe"),
        Tokenizer.from_hf_dir(root / "unigram"),
    ]


def uses(tokenizers: list[Tokenizer], compiler: GrammarCompiler) -> list[Callable[[str], None]]:
    """One piece of request work per entry: a tokenizer encoding, or a structured output compiled."""

    def encode(tok: Tokenizer) -> Callable[[str], None]:
        return lambda text: tok.encode(f"Say {text} twice") and None

    def constrain(kind: StructuredKind, source: Callable[[str], str]) -> Callable[[str], None]:
        def run(text: str) -> None:
            guide = compiler.guide(compiler.compile(StructuredOutput(kind, source(text))))
            guide.matcher.compute_ff_tokens()
            guide.release()

        return run

    return [
        *(encode(tok) for tok in tokenizers),
        constrain(StructuredKind.JSON_SCHEMA, lambda t: json.dumps({"const": t})),
        constrain(StructuredKind.REGEX, re.escape),
        constrain(StructuredKind.CHOICE, lambda t: json.dumps([t, "other"])),
        constrain(StructuredKind.GRAMMAR, lambda t: f'start: {json.dumps(t)} | "other"'),
    ]


def main() -> None:
    tokenizers = load(Path(sys.argv[1]))
    compiler = GrammarCompiler(tokenizers[1], tokenizers[1].vocab_size)
    text = bytes.fromhex(os.read(0, 1 << 16).decode()).decode()
    work = uses(tokenizers, compiler)
    pools = [ThreadPoolExecutor(max_workers=1) for _ in work]
    for pool, fn in zip(pools, work):
        pool.submit(fn, text).result()
    del text
    gc.collect()
    for pool in pools:
        pool.submit(scrub_thread).result()
    scrub_thread()
    print("ready", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
