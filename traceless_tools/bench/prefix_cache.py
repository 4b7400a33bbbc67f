"""`traceless bench prefix-cache`: what prefix caching buys, per cache mode, on live servers.

Two workloads, each on `off`, `isolated` (one user: one cache_salt), `isolated` with the system
prompt declared public (`--public-prefix`; every request from a different user/salt), and
`global` (the insecure shared baseline):
  system   N requests sharing a long system prompt, each with its own short question
  chat     a multi-turn conversation; every turn resends the whole history (the previous
           turns' prompts and the model's answers)
TTFT is measured from the client (streamed chat completions).
"""

from __future__ import annotations

import json
import secrets
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from traceless_tools.local.services import spawn_serve
from traceless_tools.report.output import finish

SYSTEM = (
    "You are a meticulous assistant for a hospital pharmacy. Follow the dosage tables exactly, cite the "
    "relevant section for every answer, and refuse to speculate about anything outside the formulary. "
)
QUESTIONS = [
    "What is the maximum daily dose of paracetamol for adults?",
    "Can ibuprofen be combined with warfarin?",
    "How should insulin pens be stored?",
    "What is the pediatric dose of amoxicillin?",
    "When is a loading dose of digoxin used?",
    "What are the signs of lithium toxicity?",
]
CONFIGS = (
    ("off", ["--prefix-cache", "off"], "none"),
    ("isolated", ["--prefix-cache", "isolated"], "same"),
    ("isolated+public", ["--prefix-cache", "isolated"], "each"),
    ("global", ["--prefix-cache", "global"], "none"),
)


def _ttft_chat(client: httpx.Client, model: str, messages: list[dict], salt: str | None) -> tuple[float, str]:
    body = {"model": model, "messages": messages, "max_tokens": 24, "temperature": 0, "stream": True}
    if salt:
        body["cache_salt"] = salt
    t0, ttft, text = time.perf_counter(), None, []
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"]
                if delta and delta[0]["delta"].get("content"):
                    ttft = ttft or time.perf_counter() - t0
                    text.append(delta[0]["delta"]["content"])
    return ttft or time.perf_counter() - t0, "".join(text)


def _salt(policy: str, fixed: str) -> str | None:
    return {"none": None, "same": fixed, "each": secrets.token_urlsafe(24)}[policy]


def system_workload(client, model, policy, system: str) -> list[float]:
    fixed = secrets.token_urlsafe(24)
    return [
        _ttft_chat(
            client, model, [{"role": "system", "content": system}, {"role": "user", "content": q}], _salt(policy, fixed)
        )[0]
        for q in QUESTIONS
    ]


def chat_workload(client, model, policy, system: str, turns: int = 4) -> list[float]:
    fixed = secrets.token_urlsafe(24)
    salt = _salt("same" if policy == "each" else policy, fixed)  # one user's conversation
    messages, ttfts = [{"role": "system", "content": system}], []
    for q in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": q})
        ttft, answer = _ttft_chat(client, model, messages, salt)
        ttfts.append(ttft)
        messages.append({"role": "assistant", "content": answer})
    return ttfts


def run(repeat_system: int, json_path: str | None, model: str | None = None) -> dict:
    system = SYSTEM * repeat_system
    workdir = Path(tempfile.mkdtemp(prefix="traceless-bench-"))
    (workdir / "system.txt").write_text(system)
    rows = []
    try:
        for name, args, policy in CONFIGS:
            extra = ["--public-prefix", str(workdir / "system.txt")] if name == "isolated+public" else []
            model_args = ["--model", model] if model else []
            with spawn_serve(
                *model_args, *args, *extra, "--kv-cache-memory", "1GiB", name=name, workdir=workdir
            ) as svc:
                with httpx.Client(base_url=svc.url, timeout=300) as client:
                    m = client.get("/v1/models").json()["data"][0]["id"]
                    _ttft_chat(client, m, [{"role": "user", "content": "warm up"}], None)
                    sys_t = system_workload(client, m, policy, system)
                    chat_t = chat_workload(client, m, policy, system)
            rows.append(
                {
                    "config": name,
                    "system_first_s": sys_t[0],
                    "system_rest_median_s": statistics.median(sys_t[1:]),
                    "chat_turn_s": chat_t,
                }
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report = {"benchmark": "prefix-cache", "system_prompt_chars": len(system), "rows": rows}
    return finish(report, print_report, json_path)


def print_report(rep: dict) -> None:
    print(f"\ntraceless bench prefix-cache  (system prompt {rep['system_prompt_chars']} chars; TTFT in seconds)")
    print(f"{'cache':<17}{'system: 1st':>12}{'system: rest':>14}   multi-turn chat: turn 1..n")
    for r in rep["rows"]:
        turns = " ".join(f"{t:.3f}" for t in r["chat_turn_s"])
        print(f"{r['config']:<17}{r['system_first_s']:>12.3f}{r['system_rest_median_s']:>14.3f}   {turns}")
    print(
        "isolated: one user's requests share their own cache (same cache_salt); isolated+public: a different user\n"
        "per request, sharing only the declared public system prompt; global is the insecure shared baseline."
    )
