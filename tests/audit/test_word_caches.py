"""Tokenizers and the grammar compiler keep no word of a request: the residue audit's needles (every
word alone, byte-level `Ġ` and SentencePiece `▁` forms, UTF-16/32, Cyrillic and CJK words, token
ids as int32/int64 arrays) are searched in a process that tokenized and compiled a canary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.word_cache_child import load, write_tokenizers
from traceless_tools.audit.canary import Canary, anchors, new_canary, text_needles, token_needles
from traceless_tools.audit.memscan import scan_process

REPO = Path(__file__).resolve().parents[2]


def _forms(canary: Canary, root: Path) -> dict[str, list[bytes]]:
    forms = text_needles(canary)
    for tok in load(root):
        for form, needles in token_needles(canary, lambda t, tok=tok: tok.encode(t, add_special_tokens=False)).items():
            forms[form] = sorted(set(forms.get(form, [])) | set(needles))
    return forms


def test_no_tokenizer_or_grammar_compiler_keeps_a_canary_word(tmp_path):
    write_tokenizers(tmp_path)
    canary = new_canary()
    forms = _forms(canary, tmp_path)
    assert forms["token ids (int32)"] and forms["word, byte-level BPE (Ġ)"]
    env = {
        **os.environ,
        "PYTHONMALLOC": "malloc",
        "MALLOC_PERTURB_": "165",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.word_cache_child", str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        child.stdin.write(canary.text.encode().hex().encode())
        child.stdin.close()
        assert child.stdout.readline().strip() == b"ready"
        counts = scan_process(child.pid, [n for ns in forms.values() for n in ns], anchors(forms))
    finally:
        child.kill()
        child.wait()
    hits = {form: sum(counts[n] for n in needles) for form, needles in forms.items()}
    assert hits == dict.fromkeys(forms, 0)
