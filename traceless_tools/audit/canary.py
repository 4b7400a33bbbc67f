"""Canaries for the residue audit, and every form a runtime may hold them in.

A canary is three random words, one each in Latin, Cyrillic and CJK script. A process that saw it
may keep it whole, or keep single words: a tokenizer's word cache holds each word as its
pre-tokenizer wrote it (byte-level BPE: the word's UTF-8 bytes mapped to printable characters,
a leading space as `Ġ`; SentencePiece: `▁word`), a runtime may hold text as UTF-16 or UTF-32
(Python's own strings of non-Latin text are UCS-2 or UCS-4), and an engine holds token ids as
int32 or int64 arrays. `needles` lists each of these forms.

Every word starts with a fixed anchor of its script, so the memory scan looks for a few anchors
in each encoding and checks the needles only where one occurs (memscan.py), not every needle
over all of memory.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

LATIN, CYRILLIC = "abcdefghijklmnopqrstuvwxyz", "абвгдежзийклмнопрстуфхцчшщыэюя"
ANCHORS = ("qjx", "щъж", "鼷鼯")  # one per script; rare in any text
_WIDE = ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")
MIN_ID_RUN = 3  # fewer token ids in a row are not distinctive enough to count as a trace
# nor are runs of fewer distinct ids: a small vocabulary spells a foreign word as one unknown id
# over and over, and [0, 0, 0] as int32 is every zeroed page
MIN_DISTINCT_IDS = 3


@dataclass(frozen=True, slots=True)
class Canary:
    words: tuple[str, str, str]  # Latin, Cyrillic, CJK

    @property
    def text(self) -> str:
        return " ".join(self.words)

    def __repr__(self) -> str:
        return "Canary(...)"


def new_canary() -> Canary:
    latin = ANCHORS[0] + "".join(secrets.choice(LATIN) for _ in range(9))
    cyrillic = ANCHORS[1] + "".join(secrets.choice(CYRILLIC) for _ in range(8))
    cjk = ANCHORS[2] + "".join(chr(0x4E00 + secrets.randbelow(0x9FA5 - 0x4E00)) for _ in range(5))
    return Canary((latin, cyrillic, cjk))


def _byte_level_map() -> dict[int, str]:
    """GPT-2's byte-to-character map (byte-level BPE): printable bytes stand for themselves, the
    rest move to U+0100 and up (a space becomes `Ġ`, U+0120)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    moved = (b for b in range(256) if b not in table)
    table.update((b, chr(256 + i)) for i, b in enumerate(moved))
    return table


BYTE_LEVEL = _byte_level_map()


def byte_level(text: str) -> str:
    return "".join(BYTE_LEVEL[b] for b in text.encode())


def text_needles(canary: Canary) -> dict[str, list[bytes]]:
    """form -> needles: the whole canary and each word alone, in every text encoding."""
    forms: dict[str, list[bytes]] = {
        "whole canary": [canary.text.encode()],
        "word (utf-8)": [],
        "word, byte-level BPE (Ġ)": [],
        "word, SentencePiece (▁)": [],
    }
    for enc in _WIDE:
        forms[f"whole canary ({enc})"] = [canary.text.encode(enc)]
        forms[f"word ({enc})"] = [w.encode(enc) for w in canary.words]
    for w in canary.words:
        forms["word (utf-8)"].append(w.encode())
        forms["word, byte-level BPE (Ġ)"] += [byte_level(" " + w).encode(), byte_level(w).encode()]
        forms["word, SentencePiece (▁)"].append(("\u2581" + w).encode())
    forms["word, byte-level BPE (Ġ)"] = sorted(set(forms["word, byte-level BPE (Ġ)"]) - set(forms["word (utf-8)"]))
    return forms


def token_needles(canary: Canary, encode: Callable[[str], list[int]]) -> dict[str, list[bytes]]:
    """form -> needles: the token ids of the canary and of each word (at the start of a text and
    after a space), as little-endian int32 and int64 arrays."""
    runs = {tuple(encode(t)) for w in canary.words for t in (w, " " + w)} | {tuple(encode(canary.text))}
    runs = {r for r in runs if len(r) >= MIN_ID_RUN and len(set(r)) >= MIN_DISTINCT_IDS}
    return {
        f"token ids (int{bits})": sorted(b"".join(i.to_bytes(bits // 8, "little") for i in r) for r in runs)
        for bits in (32, 64)
    }


def anchors(forms: dict[str, list[bytes]]) -> list[bytes]:
    """The byte strings the scan looks for: each script's anchor in every encoding a text needle
    may use, and the first id of every token-id needle. Where both byte orders of UTF-16 (or
    UTF-32) share 3 bytes or more, those stand for both; an int64 id starts with its int32 bytes
    (ids are below 2**32, little-endian). Zero bytes at an anchor's ends are left off where 3 bytes
    or more are left: the scan's pass is slow for strings that start with a byte as common as zero
    (and a search for one that ends in zeros too). Every needle still holds one (memscan checks)."""
    out = set()
    for a in ANCHORS:
        out |= {a.encode(), byte_level(a).encode()}
        for le, be in (a.encode("utf-16-le"), a.encode("utf-16-be")), (a.encode("utf-32-le"), a.encode("utf-32-be")):
            shared = _longest_common(le, be)
            out |= {_trimmed(shared)} if len(shared) >= 3 else {_trimmed(le), _trimmed(be)}
    for form, needles in forms.items():
        if form.startswith("token ids"):
            out |= {_trimmed(n[:4]) for n in needles}
    return sorted(out)


def _longest_common(a: bytes, b: bytes) -> bytes:
    """The longest byte string both contain (the first found of that length)."""
    return max((a[i:j] for i in range(len(a)) for j in range(i + 1, len(a) + 1) if a[i:j] in b), key=len, default=b"")


def _trimmed(anchor: bytes) -> bytes:
    """The anchor without zero bytes at its start, nor at its end, where 3 bytes or more are left."""
    core = anchor.lstrip(b"\0") if len(anchor.lstrip(b"\0")) >= 3 else anchor
    return core.rstrip(b"\0") if len(core.rstrip(b"\0")) >= 3 else core
