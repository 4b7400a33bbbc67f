"""`traceless bench serve`: an online benchmark against any OpenAI-compatible server.

Requests arrive as a Poisson process at `rate` per second (all at once for rate=inf), each a
streamed /v1/completions call with a deterministic token-id prompt and a fixed output length
(`ignore_eos`, which vLLM and traceless both accept). Per request: time to first token,
inter-token latencies (between streamed chunks that carry tokens), end-to-end latency.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

from traceless_tools.report.output import finish


@dataclass(slots=True)
class RequestResult:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class BenchConfig:
    url: str
    rate: float
    num_prompts: int
    input_len: int
    output_len: int
    seed: int = 0
    model: str | None = None
    api_key: str | None = None
    ignore_eos: bool = True


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def one_request(client, cfg: BenchConfig, model: str, prompt: list[int]) -> RequestResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": cfg.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    res = RequestResult(ok=False)
    t0 = time.perf_counter()
    last = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                    res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                if any(c.get("text") for c in chunk.get("choices", [])):
                    now = time.perf_counter()
                    if last is None:
                        res.ttft_s = now - t0
                    else:
                        res.itl_s.append(now - last)
                    last = now
    except Exception:  # a failed request counts as failed; the benchmark goes on
        return res
    res.e2e_s = time.perf_counter() - t0
    res.ok = last is not None
    return res


async def run_async(cfg: BenchConfig) -> dict:
    import httpx
    from tqdm.auto import tqdm

    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=max(cfg.num_prompts, 1))
    async with httpx.AsyncClient(base_url=cfg.url.rstrip("/"), timeout=600, headers=headers, limits=limits) as client:
        model = cfg.model or (await client.get("/v1/models")).json()["data"][0]["id"]
        rng = random.Random(cfg.seed)
        prompts = [[rng.randrange(1_000, 40_000) for _ in range(cfg.input_len)] for _ in range(cfg.num_prompts)]
        bar = tqdm(total=cfg.num_prompts, desc="requests", unit="req")

        async def timed(p):
            r = await one_request(client, cfg, model, p)
            bar.update(1)
            return r

        tasks = []
        t0 = time.perf_counter()
        for p in prompts:
            tasks.append(asyncio.create_task(timed(p)))
            if cfg.rate != float("inf"):
                await asyncio.sleep(rng.expovariate(cfg.rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        bar.close()
    return summarize(cfg, model, results, duration)


def summarize(cfg: BenchConfig, model: str, results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    itl = [x for r in ok for x in r.itl_s]
    out_tokens = sum(r.output_tokens for r in ok)

    def dist(values):
        return {
            "mean": statistics.fmean(values) if values else float("nan"),
            **{f"p{p}": percentile(values, p) for p in (50, 90, 99)},
        }

    return {
        "url": cfg.url,
        "model": model,
        "rate": cfg.rate,
        "num_prompts": cfg.num_prompts,
        "input_len": cfg.input_len,
        "output_len": cfg.output_len,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "requests_per_s": len(ok) / duration,
        "output_tokens_per_s": out_tokens / duration,
        "ttft_s": dist([r.ttft_s for r in ok]),
        "itl_s": dist(itl),
        "e2e_s": dist([r.e2e_s for r in ok]),
    }


def print_report(rep: dict) -> None:
    print(
        f"\ntraceless bench serve  {rep['url']}  model={rep['model']}  rate={rep['rate']}/s  "
        f"{rep['num_prompts']} x ({rep['input_len']} in, {rep['output_len']} out)"
    )
    print(
        f"completed {rep['completed']}  failed {rep['failed']}  duration {rep['duration_s']:.2f}s  "
        f"requests/s {rep['requests_per_s']:.3f}  output tokens/s {rep['output_tokens_per_s']:.1f}"
    )
    print(f"{'latency (ms)':<14}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("e2e_s", "end-to-end")):
        d = rep[key]
        print(f"{label:<14}" + "".join(f"{d[k] * 1e3:>10.1f}" for k in ("mean", "p50", "p90", "p99")))


def run(cfg: BenchConfig, json_path: str | None) -> dict:
    return finish(asyncio.run(run_async(cfg)), print_report, json_path)
