"""`traceless chat`'s conversation: answers stream token by token; Ctrl-C while the model answers
ends that answer (its engine request is aborted: the KV blocks freed and zeroed) and returns to the
prompt; Ctrl-C or end of input at the prompt ends the chat."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any, TextIO

INTERRUPTED = " [interrupted]"


class DeferredInterrupt:
    """While active, Ctrl-C sets `pressed` instead of raising KeyboardInterrupt: an engine step cut
    half-way could leave its bookkeeping half-updated, so the answer is ended between two steps."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous: Any = None  # the SIGINT handler to put back

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._note)
        return self

    def __exit__(self, *exc) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler if self._previous is None else self._previous)

    def _note(self, signum, frame) -> None:
        self.pressed = True


def answer(llm, history: list[dict], params, out: TextIO) -> str | None:
    """Stream one answer to `out`; returns its text, or None when Ctrl-C ended it."""
    pieces: list[str] = []
    with DeferredInterrupt() as interrupt:
        stream = llm.stream_chat(history, params)
        try:
            for piece in stream:
                if interrupt.pressed:
                    break
                pieces.append(piece)
                out.write(piece)
                out.flush()
        finally:
            stream.close()  # before the answer ends: the request is aborted
    out.write(INTERRUPTED + "\n" if interrupt.pressed else "\n")
    out.flush()
    reply = "".join(pieces)
    pieces.clear()
    return None if interrupt.pressed else reply


def converse(llm, params, interactive: bool, out: TextIO = sys.stdout) -> int:
    """The read-answer loop. An interrupted turn is left out of the history (asked again, it starts
    afresh). Returns the exit status (0)."""
    history: list[dict] = []
    try:
        while True:
            try:
                line = input("you> " if interactive else "")
            except (EOFError, KeyboardInterrupt):
                if interactive:
                    out.write("\n")
                break
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            out.write("assistant> ")
            reply = answer(llm, history, params, out)
            if reply is None:
                history.pop()
            else:
                history.append({"role": "assistant", "content": reply})
    finally:
        history.clear()
    return 0
