"""Incremental detokenization with stop strings, per request.

Text is emitted as soon as it cannot be the start of a stop string: the last
(longest stop string - 1) characters are held back. A stop string that begins inside text
already emitted would have been found when that text was emitted, because it then lay wholly
inside the buffer that was searched.

    pending buffer:  [ ..... emitted now ..... | held back (h chars) ]
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from traceless.model.tokenizer import Tokenizer


class IncrementalDetokenizer:
    __slots__ = ("_tokenizer", "_stream", "_stops", "_hold", "_pending")

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...], skip_special_tokens: bool):
        self._tokenizer = tokenizer
        self._stream: DecodeStream | None = tokenizer.decode_stream(skip_special_tokens)
        self._stops = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._pending = ""

    def add(self, token_id: int) -> tuple[str, str | None]:
        """Feed one token; returns (text now safe to emit, the stop string that matched or None).
        After a match the request is finished and nothing after the match is emitted."""
        if self._stream is None:
            raise RuntimeError("the detokenizer was wiped: its request has ended")
        piece = self._stream.step(self._tokenizer.backend, token_id) or ""
        buf = self._pending + piece
        if self._stops:
            hits = [(buf.find(s), s) for s in self._stops]
            hits = [(i, s) for i, s in hits if i >= 0]
            if hits:
                idx, stop = min(hits)
                self._pending = ""
                return buf[:idx], stop
        cut = max(len(buf) - self._hold, 0)
        self._pending = buf[cut:]
        return buf[:cut], None

    def flush(self) -> str:
        """The held-back text, when the request ends for a reason other than a stop string."""
        out, self._pending = self._pending, ""
        return out

    def wipe(self) -> None:
        self._pending = ""
        self._stream = None
