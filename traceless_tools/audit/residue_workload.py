"""The residue audit's workload: every path a request can take, each carrying its own canary.

Paths: plain and chat completions, a chunked stream, a stream the client aborts, failing requests
(an unsupported parameter, a context overflow), a JSON-schema constrained chat, a regex and a
choice (the canary in the constraint, so the grammar compiler tokenizes it), a forced tool call
(the canary in the tool's description and its forced arguments), prefix-cached requests in one
cache_salt domain, and requests preempted under memory pressure with encrypted KV offload to disk.
"""

from __future__ import annotations

import re
import secrets
import threading
import time

from traceless_tools.audit.canary import Canary, new_canary
from traceless_tools.audit.residue_client import OhttpTestClient, PlainTestClient

PATHS = (
    "plain",
    "chat",
    "stream",
    "abort",
    "fail_param",
    "fail_context",
    "preempt",
    "prefix",
    "schema",
    "regex",
    "choice",
    "tool",
)


def new_canaries() -> dict[str, Canary]:
    return {p: new_canary() for p in PATHS}


def send_workload(
    client: OhttpTestClient | PlainTestClient,
    canaries: dict[str, Canary],
    model: str,
    spill_hits: list,
    spill_needles: list[bytes],
) -> None:
    c = {p: canary.text for p, canary in canaries.items()}
    client.completion({"model": model, "prompt": f"Repeat: {c['plain']}", "max_tokens": 16})
    client.chat({"model": model, "messages": [{"role": "user", "content": f"Say {c['chat']}"}], "max_tokens": 16})
    client.stream({"model": model, "prompt": f"Continue: {c['stream']}", "max_tokens": 16})
    client.stream(
        {"model": model, "prompt": f"Story of {c['abort']}", "max_tokens": 200, "ignore_eos": True}, abort_after=2
    )
    client.completion({"model": model, "prompt": c["fail_param"], "frobnicate": c["fail_param"]})
    client.completion({"model": model, "prompt": (c["fail_context"] + " ") * 40})
    _structured(client, c, model)
    salt = secrets.token_urlsafe(24)
    prefix = f"System notes {c['prefix']}. " * 6
    for q in ("first", "second", "third"):
        client.completion({"model": model, "prompt": prefix + q, "max_tokens": 4, "cache_salt": salt})
    _preempt(client, model, c["preempt"], spill_hits, spill_needles)


def _structured(client: OhttpTestClient | PlainTestClient, c: dict[str, str], model: str) -> None:
    """The canary in a JSON schema, a regex, a choice, and a tool's description and forced arguments:
    each is compiled (tokenized) and the model is forced to write it."""
    schema = {"type": "object", "properties": {"k": {"const": c["schema"]}}, "required": ["k"]}
    client.chat(
        {
            "model": model,
            "messages": [{"role": "user", "content": "json"}],
            "max_tokens": 160,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        }
    )
    client.completion(
        {"model": model, "prompt": "pattern", "max_tokens": 160, "structured_outputs": {"regex": re.escape(c["regex"])}}
    )
    client.completion(
        {"model": model, "prompt": "pick", "max_tokens": 160, "structured_outputs": {"choice": [c["choice"], "none"]}}
    )
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "description": c["tool"],
            "parameters": {"type": "object", "properties": {"v": {"const": c["tool"]}}, "required": ["v"]},
        },
    }
    client.chat(
        {
            "model": model,
            "messages": [{"role": "user", "content": "call"}],
            "max_tokens": 200,
            "tools": [tool],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        }
    )


def _preempt(
    client: OhttpTestClient | PlainTestClient, model: str, canary: str, spill_hits: list, spill_needles: list[bytes]
) -> None:
    """Eight long requests at once on a small KV cache: preemption, with KV sealed to disk. While
    they run, every spill file that appears is read and searched for the canary in every form."""
    stop_watch = threading.Event()

    def watch():
        while not stop_watch.is_set():
            for f in client.offload_dir.iterdir():
                try:
                    data = f.read_bytes()
                except OSError:
                    continue
                client.spill_files_seen.add(f.name)
                spill_hits.append(sum(data.count(n) for n in spill_needles))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = [
        threading.Thread(
            target=client.completion,
            args=({"model": model, "prompt": f"Chapter {i} about {canary}.", "max_tokens": 100, "ignore_eos": True},),
        )
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop_watch.set()
    watcher.join()
