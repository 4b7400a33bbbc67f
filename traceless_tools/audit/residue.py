"""`traceless audit residue`: send canaries through every path a request can take, wait for the
TTLs, then look everywhere a trace could hide: on a private node and on the plaintext server.

The paths are residue_workload.py's; they go to a real `traceless node` over OHTTP, as a client
would send them, and, side by side, as plain HTTP to a real `traceless serve` with the same engine
settings.
Each path has its own canary: three random words (Latin, Cyrillic, CJK), searched whole and word by
word in every form a runtime may keep them (canary.py: UTF-8, byte-level BPE `Ġword`,
SentencePiece `▁word`, UTF-16/32, and their token ids as int32/int64 arrays).

Places: the KV pool and prefix cache (the allowlisted gauges on the operator's listener: non-zero
blocks, cached blocks, swapped requests, peak usage), the offload directory (while requests are
swapped out, and after), the log streams and every file the process wrote (its cwd, HOME and
TMPDIR point into the audit's directory), the metrics output, and the process's readable memory
(/proc/PID/mem). Any hit anywhere, process memory included, is a failure: with freed-memory
scrubbing (the default of both commands) Python's immutable strings of finished requests are
overwritten when freed, and no tokenizer keeps a word cache. The audited processes publish a
telemetry window at every scrape, exactly (`--metrics-min-requests 0 --metrics-epsilon off`: the
audit's switches), so the gauges read the state of the moment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from traceless_tools.audit.canary import Canary, anchors, text_needles, token_needles
from traceless_tools.audit.memscan import scan_process
from traceless_tools.audit.residue_client import OhttpTestClient, PlainTestClient
from traceless_tools.audit.residue_workload import PATHS, new_canaries, send_workload
from traceless_tools.local.load import cpu_load
from traceless_tools.local.services import free_port, stop, wait_ready
from traceless_tools.report.output import finish


@dataclass(frozen=True, slots=True)
class ResidueConfig:
    model: str | None = None
    ttl_s: float = 3.0
    scrub: bool = True  # the node's default: freed-memory scrubbing (glibc MALLOC_PERTURB_)
    load: int = 0  # CPU-bound processes beside the audited servers (threads then run late)

    def __post_init__(self) -> None:
        if self.load < 0:
            raise ValueError("--load must be 0 or more busy processes")


class ProcessUnderAudit:
    """`traceless node` or `traceless serve` with the audit's settings, in its own directory."""

    def __init__(self, cfg: ResidueConfig, workdir: Path, command: str):
        self.command = command
        self.workdir = workdir
        self.offload = workdir / "offload"
        self.log_path = workdir / f"{command}.log"
        for d in ("home", "tmp", "cwd"):
            (workdir / d).mkdir(parents=True, exist_ok=True)
        port, metrics_port = free_port(), free_port()
        self.url, self.metrics_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}"
        env = {**os.environ, "HOME": str(workdir / "home"), "TMPDIR": str(workdir / "tmp"), "PYTHONUNBUFFERED": "1"}
        args = [
            command,
            "--scrub-freed-memory" if cfg.scrub else "--no-scrub-freed-memory",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--metrics-min-requests",
            "0",
            "--metrics-epsilon",
            "off",
            "--metrics-window",
            "0.2",
            "--kv-offload",
            "disk",
            "--kv-offload-dir",
            str(self.offload),
            "--prefix-cache-ttl",
            str(cfg.ttl_s),
            "--kv-cache-memory",
            _kv_budget(cfg.model),
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--max-num-seqs",
            "8",
        ] + (["--model", cfg.model] if cfg.model else [])
        with open(self.log_path, "wb") as log:
            cli = [sys.executable, "-m", "traceless_tools.cli", *args]
            self.proc = subprocess.Popen(
                cli, cwd=workdir / "cwd", env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_ready(self.proc, self.url + "/health")

    def client(self) -> OhttpTestClient | PlainTestClient:
        if self.command == "node":
            return OhttpTestClient(self.url, self.offload, self.log_path)
        return PlainTestClient(self.url, self.offload)

    def gauges(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(self.metrics_url + "/metrics").text.splitlines():
            if line.startswith(("traceless_kv_", "traceless_prefix_cache_blocks", "traceless_window_peak_")):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


Needles = dict[str, dict[str, list[bytes]]]  # path -> form -> needles


def needles_of(canaries: dict[str, Canary], model: str | None) -> Needles:
    """Every form of every path's canary; token ids as the audited model's tokenizer writes them."""
    from traceless.model.loader import load_tokenizer

    tok = load_tokenizer(model)

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    return {p: {**text_needles(c), **token_needles(c, encode)} for p, c in canaries.items()}


def run(cfg: ResidueConfig, json_path: str | None) -> dict:
    # The node and the plaintext server are audited side by side: two processes of their own, each
    # with its own canaries (a hit in one is that process's own), and most of an audit is waiting
    # (for TTLs, for an idle scan) or the other's work.
    with cpu_load(cfg.load), ThreadPoolExecutor(2) as pool:
        node_f = pool.submit(audit_process, cfg, "node", new_canaries())
        serve_f = pool.submit(audit_process, cfg, "serve", new_canaries())
        node, serve = node_f.result(), serve_f.result()
    report = {
        "audit": "residue",
        "scrub": cfg.scrub,
        "load_processes": cfg.load,
        "paths": list(PATHS),
        **node,
        "serve": serve,
        "failed": _failed(node) or _failed(serve),
    }
    return finish(report, print_report, json_path)


def _failed(rep: dict) -> bool:
    return any(v != 0 for v in rep["places"].values()) or rep["process_memory_total"] != 0


def audit_process(cfg: ResidueConfig, command: str, canaries: dict[str, Canary]) -> dict:
    """Run the workload against one `traceless node` or `traceless serve`, then search it."""
    needles = needles_of(canaries, cfg.model)
    flat = [n for forms in needles.values() for ns in forms.values() for n in ns]
    workdir = Path(tempfile.mkdtemp(prefix="traceless-residue-"))
    proc = ProcessUnderAudit(cfg, workdir, command)
    spill_hits: list[int] = []
    try:
        client = proc.client()
        send_workload(
            client, canaries, client.model_name(), spill_hits, [n for ns in needles["preempt"].values() for n in ns]
        )
        gauges = _wait_quiet(proc, cfg.ttl_s)
        places = {
            "kv pool: non-zero blocks": gauges.get("traceless_kv_blocks_nonzero", -1),
            "kv pool: blocks in use": round(gauges.get("traceless_window_peak_kv_cache_usage_ratio", -1) * 1e6),
            "prefix cache: resident blocks": gauges.get("traceless_prefix_cache_blocks", -1),
            "offload: swapped requests": gauges.get("traceless_kv_offload_swapped_requests", -1),
            "offload dir: files left": sum(1 for _ in proc.offload.iterdir()) if proc.offload.exists() else 0,
            "offload dir: canaries in spill files": sum(spill_hits),
            "metrics output": _count(httpx.get(proc.metrics_url + "/metrics").content, flat),
        }
        memory = scan_process(
            proc.proc.pid, flat, anchors({f: ns for forms in needles.values() for f, ns in forms.items()})
        )
    except BaseException:
        stop(proc.proc)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    stop(proc.proc)
    places["log streams"] = _count(proc.log_path.read_bytes(), flat)
    places["files it wrote"] = sum(
        _count(p.read_bytes(), flat) for p in workdir.rglob("*") if p.is_file() and p != proc.log_path
    )
    preempted = sum(
        json.loads(line).get("num_requests", 0)
        for line in proc.log_path.read_text().splitlines()
        if line.startswith('{"ts"') and '"engine.preempted"' in line
    )
    shutil.rmtree(workdir, ignore_errors=True)  # searched above; the audit leaves nothing of its own
    by_path = {p: sum(memory[n] for ns in forms.values() for n in ns) for p, forms in needles.items()}
    by_form: dict[str, int] = {}
    for forms in needles.values():
        for form, ns in forms.items():
            by_form[form] = by_form.get(form, 0) + sum(memory[n] for n in ns)
    return {
        "command": command,
        "spill_files_seen": len(client.spill_files_seen),
        "preemptions": preempted,
        "places": places,
        "process_memory": by_path,
        "process_memory_forms": by_form,
        "process_memory_total": sum(by_path.values()),
    }


def _count(data: bytes, needles: list[bytes]) -> int:
    return sum(data.count(n) for n in needles)


def _wait_quiet(proc: ProcessUnderAudit, ttl_s: float, timeout: float = 90.0) -> dict:
    """Wait for the TTLs and an idle residue scan: until the pool reads empty (or the timeout)."""
    time.sleep(ttl_s + 1.0)
    deadline = time.monotonic() + timeout
    gauges = proc.gauges()
    while time.monotonic() < deadline:
        gauges = proc.gauges()
        quiet = gauges.get("traceless_window_peak_requests_running", 1) == 0 and "traceless_kv_blocks_nonzero" in gauges
        if quiet and gauges["traceless_kv_blocks_nonzero"] == 0 and gauges.get("traceless_prefix_cache_blocks", 1) == 0:
            break
        time.sleep(1.0)
    time.sleep(4.0)  # one more idle scan (and idle collection) after the last request
    return proc.gauges()


def print_report(rep: dict) -> None:
    for name, r in (("node", rep), ("plaintext server", rep["serve"])):
        print(
            f"\ntraceless audit residue: {name}  (paths: {', '.join(rep['paths'])}; preemptions "
            f"{r['preemptions']}, spill files seen during the run: {r['spill_files_seen']}; "
            f"{rep['load_processes']} CPU-bound processes beside)"
        )
        print(f"{'place':<40}{'hits':>8}")
        for place, hits in r["places"].items():
            print(f"{place:<40}{hits:>8g}")
        print(
            f"{'process memory (canary occurrences)':<40}{r['process_memory_total']:>8}"
            f"{'   (freed memory scrubbed)' if rep['scrub'] else ''}"
        )
        for path, n in r["process_memory"].items():
            print(f"    {path:<36}{n:>8}")
        print("  by form:")
        for form, n in r["process_memory_forms"].items():
            print(f"    {form:<36}{n:>8}")
    print("RESULT: " + ("FAIL: residue found" if rep["failed"] else "no residue on the node or the plaintext server"))


# The audited server's KV cache: KV_TOKENS tokens of one sequence in every KV group (which is more
# than its MAX_MODEL_LEN): the eight ~110-token requests of the preemption path run out of it and
# spill to the offload directory.
KV_TOKENS = 540
MAX_MODEL_LEN = 512


def _kv_budget(model: str | None) -> str:
    """--kv-cache-memory in bytes for KV_TOKENS tokens of `model`: its blocks hold every layer slot
    in the dtype of the engine's cache (runner/build.py cache_dtype, for the server's default
    options), and a sequence takes blocks in each KV group (model/kv_groups.py; a windowed group
    at most its window's), as the engine counts them (runner/kv_budget.py)."""
    from traceless.config import EngineConfig
    from traceless.model.layers.kv_cache import block_bytes
    from traceless.model.loader import read_model_config
    from traceless.runner.build import cache_dtype
    from traceless.runner.kv_budget import group_blocks

    cfg, mc = EngineConfig(model=model), read_model_config(model)
    windows = mc.kv_groups.windows
    blocks = group_blocks(KV_TOKENS, 1, cfg.block_size, windows, cfg.max_num_batched_tokens) + 1  # + the null block
    return str(blocks * block_bytes(mc, cfg.block_size, cache_dtype(cfg)))
