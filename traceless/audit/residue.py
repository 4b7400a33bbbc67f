"""`traceless audit residue`: send canaries through every path a request can take, wait for the
TTLs, then look everywhere a trace could hide.

Paths: plain and chat completions, a chunked stream, a stream the client aborts, failing requests
(an unsupported parameter, a context overflow), requests preempted under memory pressure with
encrypted KV offload to disk, and prefix-cached requests in one cache_salt domain. All go to a
real `traceless node` over OHTTP, as a client would send them.

Places: the KV pool and prefix cache (the node's allowlisted gauges: non-zero blocks, cached
blocks, swapped requests, usage), the offload directory (while requests are swapped out, and after),
the node's log streams and every file it wrote (its cwd, HOME and TMPDIR point into the audit's
directory), the /metrics output, and the node process's readable memory (/proc/PID/mem).
Any hit outside process memory is a failure. Process memory is reported as a figure to drive down:
Python strings are immutable, so parsed JSON, tokenizer inputs and detokenized text stay in freed
heap memory until it is reused, unless the allocator scrubs freed memory (--scrub).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from traceless.audit.memscan import scan_process
from traceless.audit.residue_client import OhttpTestClient
from traceless.local.services import free_port, stop, wait_ready
from traceless.report.output import finish

PATHS = ("plain", "chat", "stream", "abort", "fail_param", "fail_context", "preempt", "prefix")


@dataclass(frozen=True, slots=True)
class ResidueConfig:
    model: str | None = None
    ttl_s: float = 3.0
    scrub: bool = True  # the node's default: freed-memory scrubbing (glibc MALLOC_PERTURB_)


class NodeUnderAudit:
    def __init__(self, cfg: ResidueConfig, workdir: Path):
        self.workdir = workdir
        self.offload = workdir / "offload"
        self.log_path = workdir / "node.log"
        for d in ("home", "tmp", "cwd"):
            (workdir / d).mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "HOME": str(workdir / "home"), "TMPDIR": str(workdir / "tmp"), "PYTHONUNBUFFERED": "1"}
        args = ["node", "--scrub-freed-memory" if cfg.scrub else "--no-scrub-freed-memory", "--port", str(port),
                "--kv-offload", "disk", "--kv-offload-dir", str(self.offload),
                "--prefix-cache-ttl", str(cfg.ttl_s), "--kv-cache-memory", "40MiB", "--max-model-len", "1024",
                "--max-num-seqs", "8"] + (["--model", cfg.model] if cfg.model else [])
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "traceless.cli", *args], cwd=workdir / "cwd", env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_ready(self.proc, self.url + "/health")

    def gauges(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(("traceless_kv_", "traceless_prefix_cache_blocks", "traceless_num_requests")):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def _canaries() -> dict[str, str]:
    return {p: f"TRACELESS-CANARY-{p}-{secrets.token_hex(8)}" for p in PATHS}


def send_workload(client: OhttpTestClient, canaries: dict[str, str], model: str, spill_hits: list) -> None:
    c = canaries
    client.completion({"model": model, "prompt": f"Repeat: {c['plain']}", "max_tokens": 16})
    client.chat({"model": model, "messages": [{"role": "user", "content": f"Say {c['chat']}"}], "max_tokens": 16})
    client.stream({"model": model, "prompt": f"Continue: {c['stream']}", "max_tokens": 16})
    client.stream({"model": model, "prompt": f"Story of {c['abort']}", "max_tokens": 200, "ignore_eos": True},
                  abort_after=2)
    client.completion({"model": model, "prompt": c["fail_param"], "frobnicate": c["fail_param"]})
    client.completion({"model": model, "prompt": (c["fail_context"] + " ") * 150})
    salt = secrets.token_urlsafe(24)
    prefix = f"System notes {c['prefix']}. " * 20
    for q in ("first", "second", "third"):
        client.completion({"model": model, "prompt": prefix + q, "max_tokens": 4, "cache_salt": salt})
    _preempt(client, model, c["preempt"], spill_hits)


def _preempt(client: OhttpTestClient, model: str, canary: str, spill_hits: list) -> None:
    """Eight long requests at once on a small KV cache: preemption, with KV sealed to disk. While
    they run, every spill file that appears is read and searched for the canary."""
    stop_watch = threading.Event()

    def watch():
        while not stop_watch.is_set():
            for f in client.offload_dir.iterdir():
                try:
                    data = f.read_bytes()
                except OSError:
                    continue
                client.spill_files_seen.add(f.name)
                spill_hits.append(data.count(canary.encode()))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=client.completion, args=(
        {"model": model, "prompt": f"Chapter {i} about {canary}.", "max_tokens": 200, "ignore_eos": True},))
        for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop_watch.set()
    watcher.join()


def run(cfg: ResidueConfig, json_path: str | None) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="traceless-residue-"))
    node = NodeUnderAudit(cfg, workdir)
    canaries = _canaries()
    needles = {name: c.encode() for name, c in canaries.items()}
    spill_hits: list[int] = []
    try:
        client = OhttpTestClient(node.url, node.offload, node.log_path)
        model = client.model_name()
        send_workload(client, canaries, model, spill_hits)
        gauges = _wait_quiet(node, cfg.ttl_s)
        places = {
            "kv pool: non-zero blocks": gauges.get("traceless_kv_blocks_nonzero", -1),
            "kv pool: blocks in use": round(gauges.get("traceless_kv_cache_usage_ratio", -1) * 1e6),
            "prefix cache: resident blocks": gauges.get("traceless_prefix_cache_blocks", -1),
            "offload: swapped requests": gauges.get("traceless_kv_offload_swapped_requests", -1),
            "offload dir: files left": sum(1 for _ in node.offload.iterdir()) if node.offload.exists() else 0,
            "offload dir: canaries in spill files": sum(spill_hits),
            "metrics output": _count(httpx.get(node.url + "/metrics").content, needles),
        }
        memory = scan_process(node.proc.pid, list(needles.values()))
    except BaseException:
        stop(node.proc)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    stop(node.proc)
    places["log streams"] = _count(node.log_path.read_bytes(), needles)
    places["files the node wrote"] = sum(_count(p.read_bytes(), needles) for p in workdir.rglob("*")
                                         if p.is_file() and p != node.log_path)
    preempted = sum(json.loads(line).get("num_requests", 0) for line in node.log_path.read_text().splitlines()
                    if line.startswith('{"ts"') and '"engine.preempted"' in line)
    report = {"audit": "residue", "scrub": cfg.scrub, "paths": list(PATHS),
              "spill_files_seen": len(client.spill_files_seen),
              "preemptions": preempted,
              "places": places, "process_memory": {name: memory.get(n, 0) for name, n in needles.items()},
              "process_memory_total": sum(memory.values()), "failed": any(v != 0 for v in places.values())}
    shutil.rmtree(workdir, ignore_errors=True)  # searched above; the audit leaves nothing of its own
    return finish(report, print_report, json_path)


def _count(data: bytes, needles: dict[str, bytes]) -> int:
    return sum(data.count(n) for n in needles.values())


def _wait_quiet(node: NodeUnderAudit, ttl_s: float, timeout: float = 90.0) -> dict:
    """Wait for the TTLs and an idle residue scan: until the pool reads empty (or the timeout)."""
    time.sleep(ttl_s + 1.0)
    deadline = time.monotonic() + timeout
    gauges = node.gauges()
    while time.monotonic() < deadline:
        gauges = node.gauges()
        quiet = gauges.get("traceless_num_requests_running", 1) == 0 and "traceless_kv_blocks_nonzero" in gauges
        if quiet and gauges["traceless_kv_blocks_nonzero"] == 0 and gauges.get("traceless_prefix_cache_blocks", 1) == 0:
            break
        time.sleep(1.0)
    time.sleep(4.0)  # one more idle scan after the last request
    return node.gauges()


def print_report(rep: dict) -> None:
    print(f"\ntraceless audit residue  (paths: {', '.join(rep['paths'])}; preemptions {rep['preemptions']}, "
          f"spill files seen during the run: {rep['spill_files_seen']})")
    print(f"{'place':<40}{'hits':>8}")
    for place, hits in rep["places"].items():
        print(f"{place:<40}{hits:>8g}")
    print(f"{'process memory (canary occurrences)':<40}{rep['process_memory_total']:>8}   "
          f"(a figure to drive down{'; freed memory scrubbed' if rep['scrub'] else ''})")
    for name, n in rep["process_memory"].items():
        print(f"    {name:<36}{n:>8}")
    print("RESULT: " + ("FAIL: residue outside process memory" if rep["failed"] else
                        "no residue outside process memory"))
