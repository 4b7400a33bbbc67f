"""Steady load for the fault audit: N workers, each sending one request after another through the
proxy with the official `openai` client, every other worker streaming. Each request's outcome is
recorded with its start and end (monotonic seconds) and a failure kind from a fixed set, so the
audit can say which requests failed, when, and how. Prompts are fixed, harmless text."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

PROMPT = "Count from one to ten."


@dataclass(frozen=True, slots=True)
class Outcome:
    worker: int
    stream: bool
    start: float
    end: float
    ok: bool
    status: int | None  # HTTP status of a failure (None: none was given, e.g. an error event or a timeout)
    kind: str  # "ok", "status", "stream_error", "timeout", "connection", "other"


class Load:
    """Workers that run until `stop()`; `outcomes` grows as requests end."""

    def __init__(
        self, base_url: str, model: str, workers: int = 8, max_tokens: int | None = 12, timeout_s: float = 90.0
    ):
        """`max_tokens` None: every answer runs to the end of the context (EOS ignored), so that
        requests stay at a node long enough to overlap there."""
        try:
            import openai
        except ImportError:
            raise SystemExit("the fault audit drives load with the openai client: pip install openai") from None
        self._openai = openai
        self.base_url, self.model, self.max_tokens, self.timeout_s = base_url, model, max_tokens, timeout_s
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, args=(i,), daemon=True, name=f"fault-load-{i}") for i in range(workers)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stopping.set()
        for t in self._threads:
            t.join(self.timeout_s + 10)

    def since(self, t0: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.end >= t0]

    def _work(self, worker: int) -> None:
        # max_retries=0: the SDK would otherwise resend a failed request, hiding the failure.
        client = self._openai.OpenAI(
            base_url=self.base_url + "/v1", api_key="unused", max_retries=0, timeout=self.timeout_s
        )
        stream = worker % 2 == 1
        while not self._stopping.is_set():
            start = time.monotonic()
            ok, status, kind = self._one(client, stream)
            with self._lock:
                self.outcomes.append(Outcome(worker, stream, start, time.monotonic(), ok, status, kind))
            if not ok:
                time.sleep(0.2)  # a failing path is not hammered in a tight loop
        client.close()

    def _one(self, client, stream: bool) -> tuple[bool, int | None, str]:
        openai = self._openai
        messages = [{"role": "user", "content": PROMPT}]
        limit = {"max_tokens": self.max_tokens} if self.max_tokens else {"extra_body": {"ignore_eos": True}}
        try:
            if stream:
                chunks = client.chat.completions.create(
                    model=self.model, messages=messages, stream=True, temperature=0, **limit
                )
                finish = None
                for chunk in chunks:
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                return (True, None, "ok") if finish in ("stop", "length") else (False, None, "stream_error")
            reply = client.chat.completions.create(model=self.model, messages=messages, temperature=0, **limit)
            if reply.choices[0].finish_reason in ("stop", "length"):
                return True, None, "ok"
            return False, None, "stream_error"
        except openai.APITimeoutError:
            return False, None, "timeout"
        except openai.APIStatusError as exc:
            return False, exc.status_code, "status"
        except openai.APIConnectionError:
            return False, None, "connection"
        except openai.APIError:  # an error event inside a stream
            return False, None, "stream_error"
