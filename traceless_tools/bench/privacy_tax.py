"""`traceless bench privacy-tax`: what the private path costs next to the plaintext server, in one run.

The published confidential-computing benchmark (H100 with the TEE on, Llama-3.1-8B) reports
about 7% lower output tokens/s and 19% higher time to first token; our own privacy machinery
must cost far less. This benchmark measures it the same way:

  plain    `traceless serve` (no privacy path)
  private  `traceless up` with ONE node (the same compute as the plain server) behind the proxy:
           tokens, candidate attestation + transparency-log checks, OHTTP through relay and
           gateway, the node's scrubbing and isolated prefix cache

Both run the same engine options. Per prompt class (short 50-100 tokens, medium 300-500, long
501-1500), the same deterministic token-id prompts go to both at a fixed concurrency (closed
loop: C requests in flight, the next one sent as one finishes), each streamed with a fixed output
length (`ignore_eos`). Repetitions alternate the order (plain, private, private, plain, ...) so
drift of a shared machine falls on both sides equally; each request is measured by
`bench/serve.py`'s client. Where the extra time goes is measured separately
(privacy_tax_breakdown.py); tables, JSON and the plot are in privacy_tax_report.py.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from traceless.modes import LoadFormat, choices

PATHS = ("plain", "private")
# Ordinary vocabulary ids, as in bench/workloads.py: above the special tokens, below the smallest
# vocabulary we run.
ID_LOW, ID_HIGH = 1_000, 40_000
WARMUP_TOKENS = 2  # warm-up and probe requests use other output lengths than any measured request
# `traceless up`'s issuer grants each (fresh) user 1000 tokens per hour, fetched 8 at a time.
ISSUER_QUOTA, TOKEN_BATCH = 1000, 8


@dataclass(frozen=True, slots=True)
class PromptClass:
    name: str
    min_tokens: int
    max_tokens: int


CLASSES = {
    c.name: c for c in (PromptClass("short", 50, 100), PromptClass("medium", 300, 500), PromptClass("long", 501, 1500))
}


@dataclass(frozen=True, slots=True)
class TaxConfig:
    classes: tuple[str, ...] = ("short", "medium", "long")
    requests: int = 10  # per class, path and repetition
    output_len: int = 64
    concurrency: int = 4
    repeats: int = 4  # short alternating segments: drift of a shared machine falls on both paths
    model: str | None = None
    seed: int = 0
    probes: int = 10  # sequential 1-token requests per path for the fixed per-request cost
    workdir: str | None = None  # keep the services' event logs here (default: a temporary directory)
    device: str = "auto"  # the engines' device (plain server and node alike)
    load_format: str = "auto"  # "dummy": random weights of --model's config.json shapes (GPU shapes)

    def __post_init__(self) -> None:
        if self.load_format not in choices(LoadFormat):
            raise ValueError(f"load-format must be one of {', '.join(choices(LoadFormat))}")
        unknown = [c for c in self.classes if c not in CLASSES]
        if unknown or not self.classes:
            raise ValueError(f"unknown prompt classes {unknown}; choose from {', '.join(CLASSES)}")
        if min(self.requests, self.concurrency, self.repeats, self.probes) < 1:
            raise ValueError("requests, concurrency, repeats and probes must be at least 1")
        if self.output_len <= WARMUP_TOKENS:
            raise ValueError(f"output-len must be more than {WARMUP_TOKENS} tokens")
        if self.private_requests() > ISSUER_QUOTA - TOKEN_BATCH:
            raise ValueError(
                f"{self.private_requests()} private requests: more than the deployment's issuer "
                f"grants in one run ({ISSUER_QUOTA - TOKEN_BATCH}); lower requests, repeats or probes"
            )

    def private_requests(self) -> int:
        """Every request sent through the private path: warm-up, measured, probes."""
        return len(self.classes) * (1 + self.requests * self.repeats) + 2 * self.probes


QUICK = TaxConfig(requests=4, output_len=16, concurrency=2, repeats=1, probes=4)


def engine_args(cfg: TaxConfig) -> list[str]:
    """Engine options given to both the plain server and the node. The prefix cache stays at its
    default, `isolated`: these requests carry no cache_salt, so nothing is shared (as with `off`).
    On a GPU both engines share the device: each gets a fixed 4 GiB KV cache."""
    kv = "4GiB" if cfg.device.startswith("cuda") else "512MiB"
    # absolute: the services run in their own working directories
    model = ["--model", str(Path(cfg.model).resolve())] if cfg.model else []
    return [
        *model,
        "--kv-cache-memory",
        kv,
        "--max-model-len",
        "2048",
        "--device",
        cfg.device,
        "--load-format",
        cfg.load_format,
    ]


def class_prompts(cls: PromptClass, count: int, seed: int, rep: int) -> list[list[int]]:
    """Deterministic token-id prompts, lengths uniform in the class's range; new ones each repetition."""
    rng = random.Random(f"privacy-tax/{cls.name}/{seed}/{rep}")
    return [
        [rng.randrange(ID_LOW, ID_HIGH) for _ in range(rng.randint(cls.min_tokens, cls.max_tokens))]
        for _ in range(count)
    ]


def order(rep: int) -> tuple[str, str]:
    """plain first on even repetitions, private first on odd ones (A B B A ...)."""
    return PATHS if rep % 2 == 0 else PATHS[::-1]


# --- one measured segment ---------------------------------------------------------------------------
_MODEL_NAMES: dict[str, str] = {}  # base URL -> the model it serves (the warm-up asks; segments reuse it)


async def _closed_loop(url: str, prompts: list[list[int]], output_len: int, concurrency: int):
    import httpx

    from traceless_tools.bench.serve import BenchConfig, one_request

    cfg = BenchConfig(url, float("inf"), len(prompts), 0, output_len)
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        if url not in _MODEL_NAMES:  # asked once per URL: through the proxy it is a private-path call too
            _MODEL_NAMES[url] = (await client.get("/v1/models")).json()["data"][0]["id"]
        model = _MODEL_NAMES[url]
        pending, results = iter(prompts), []

        async def worker() -> None:
            for prompt in pending:  # one shared iterator: each worker takes the next prompt
                results.append(await one_request(client, cfg, model, prompt))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return model, results, time.perf_counter() - t0


def run_segment(url: str, prompts: list[list[int]], output_len: int, concurrency: int):
    """(model, [RequestResult], seconds) for the prompts at a fixed concurrency."""
    return asyncio.run(_closed_loop(url, prompts, output_len, concurrency))


def summary(results: list, duration: float, model: str, prompts: int, output_len: int) -> dict:
    from traceless_tools.bench.serve import BenchConfig, summarize

    cfg = BenchConfig("", float("inf"), prompts, 0, output_len)
    s = summarize(cfg, model, results, duration)
    return {
        k: s[k]
        for k in (
            "completed",
            "failed",
            "duration_s",
            "requests_per_s",
            "output_tokens_per_s",
            "ttft_s",
            "itl_s",
            "e2e_s",
        )
    }


# --- services ---------------------------------------------------------------------------------------
@contextmanager
def services(workdir: Path, args: list[str]):
    """The plain server and the one-node private deployment, started side by side; yields
    (plain Service, Deployment, endpoints) and stops both."""
    from traceless_tools.local.services import free_port, spawn_serve
    from traceless_tools.local.up import Deployment, UpOptions

    # Both log request.finished (the breakdown reads the engine's own timings from it): a benchmark's
    # switch, the same on both sides. The plain server is the privacy-off baseline, so it runs
    # without freed-memory scrubbing (its default), as it did before.
    args = [*args, "--request-events"]
    deployment = Deployment(UpOptions([1], free_port(), str(workdir / "up"), args))
    pool = ThreadPoolExecutor(1)
    started = pool.submit(deployment.start)
    try:
        with spawn_serve(*args, "--no-scrub-freed-memory", name="serve", workdir=workdir) as plain:
            yield plain, deployment, started.result()
    finally:
        wait([started])  # stop only once start() has spawned everything it is going to
        pool.shutdown()
        deployment.stop()


def _warm_up(urls: dict[str, str], cfg: TaxConfig) -> None:
    """First requests pay one-time costs (issuer key, log proofs, engine warm-up): one request per
    class and path, not measured."""
    for name in cfg.classes:
        prompts = class_prompts(CLASSES[name], 1, cfg.seed + 1_000, -1)
        for url in urls.values():
            run_segment(url, prompts, WARMUP_TOKENS, 1)


def measure_classes(urls: dict[str, str], cfg: TaxConfig, cpu) -> dict:
    """Per class: the pooled summary per path and the per-repetition ones. `cpu` snapshots the
    services' CPU time per path around every segment."""
    out = {}
    for name in cfg.classes:
        pooled: dict[str, tuple[list, float]] = {p: ([], 0.0) for p in PATHS}  # path -> (results, seconds)
        reps = []
        for rep in range(cfg.repeats):
            prompts = class_prompts(CLASSES[name], cfg.requests, cfg.seed, rep)
            row: dict[str, Any] = {"order": list(order(rep))}
            for path in order(rep):
                with cpu.segment(path, cfg.requests):
                    model, results, duration = run_segment(urls[path], prompts, cfg.output_len, cfg.concurrency)
                row[path] = summary(results, duration, model, len(prompts), cfg.output_len)
                done, total = pooled[path]
                pooled[path] = (done + results, total + duration)
            reps.append(row)
            print(
                f"  {name} rep {rep + 1}/{cfg.repeats}: output tokens/s plain "
                f"{row['plain']['output_tokens_per_s']:.1f}, private {row['private']['output_tokens_per_s']:.1f}",
                flush=True,
            )
        out[name] = {
            "prompt_tokens": [CLASSES[name].min_tokens, CLASSES[name].max_tokens],
            "repetitions": reps,
            **{p: summary(r, d, "", cfg.requests * cfg.repeats, cfg.output_len) for p, (r, d) in pooled.items()},
        }
    return out


def run(cfg: TaxConfig, json_path: str | None = None, plot_path: str | None = None) -> dict:
    from traceless_tools.bench import privacy_tax_breakdown as breakdown
    from traceless_tools.bench import privacy_tax_report as report
    from traceless_tools.report.output import finish

    workdir = Path(cfg.workdir) if cfg.workdir else Path(tempfile.mkdtemp(prefix="traceless-privacy-tax-"))
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    try:
        print("starting the plain server and the private path (one node) ...", flush=True)
        t0 = time.monotonic()
        with services(workdir, engine_args(cfg)) as (plain, deployment, endpoints):
            print(f"  ready in {time.monotonic() - t0:.0f}s", flush=True)
            urls = {"plain": plain.url, "private": endpoints["proxy"]}
            _warm_up(urls, cfg)
            cpu = breakdown.CpuMeter({"plain": {"serve": plain.proc}, "private": dict(deployment.procs)})
            window_start = time.time()
            classes = measure_classes(urls, cfg, cpu)
            window = (window_start, time.time())
            print(
                f"  measured ({time.monotonic() - t0:.0f}s so far); timing the parts of the private path ...",
                flush=True,
            )
            parts = breakdown.measure(urls, endpoints, cfg)
            parts["cpu_s_per_request"] = cpu.per_request()
        parts.update(breakdown.from_logs(workdir, deployment.logs, cfg, window))
        settings = {**asdict(cfg), "served_model": endpoints["model"], "engine_args": engine_args(cfg)}
        rep = report.build(
            settings,
            classes,
            parts,
            {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        )
    finally:
        if not cfg.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return finish(rep, report.print_report, json_path, report.plot, plot_path)


def config_from(quick: bool, **given) -> TaxConfig:
    """The defaults (or --quick's), overridden by whatever was given (None = not given)."""
    return replace(QUICK if quick else TaxConfig(), **{k: v for k, v in given.items() if v is not None})
