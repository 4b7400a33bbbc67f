"""Diagnostics for a first GPU run of the CUDA path (written without a GPU: adapt it where it breaks).

One process, one model shape: device facts and limits, kernel microbenchmarks (paged attention split
on/off, the decoder's GEMM shapes), then an engine on dummy weights: W1 step timing (wall vs GPU),
TTFT A/B (graphs vs eager in the same process, release timed apart), graph-launch CPU cost, and
torch.profiler tables for a B=1 and a B=256 decode step. Writes diag_<model>.json and
diag_<model>_profile_*.txt into the folder named by OUT (default: here). Each section is guarded:
one failure does not stop the rest.

    python3 bench/gpu/gpu_diag.py bench/models/llama-3.1-8b

(From the shared tools, adapted: the release-time scrub is now the engine's once-per-step sweep,
and an A/B of asynchronous scheduling in the same process was added.)
"""

import json
import os
import statistics
import sys
import time
import traceback

import torch
import triton

from traceless_tools.bench.gpu_limits import time_ms

OUT = os.environ.get("OUT", ".")
MODEL = sys.argv[1]
TAG = os.path.basename(MODEL.rstrip("/"))
dev = torch.device("cuda")
res: dict = {}


def save():
    with open(os.path.join(OUT, f"diag_{TAG}.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)


def section(name):
    def wrap(fn):
        t0 = time.perf_counter()
        try:
            res[name] = fn()
        except Exception:  # keep going: the next section may still tell us something
            res[name] = {"error": traceback.format_exc()[-2000:]}
        res.setdefault("section_s", {})[name] = round(time.perf_counter() - t0, 2)
        save()
        print(name, json.dumps(res[name], default=str)[:600], flush=True)

    return wrap


def gpu_ms(fn, reps=20):
    return time_ms(fn, torch.device("cuda"), reps)


@section("env")
def _env():
    from traceless_tools.bench.gpu_limits import measure_limits

    p = torch.cuda.get_device_properties(dev)
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "device": p.name,
        "sms": p.multi_processor_count,
        "mem_gib": round(p.total_memory / 2**30, 1),
        "limits": measure_limits(dev),
    }


@section("attention")
def _attention():
    from traceless.model.layers import triton_kernels as tk

    H, HKV, D, BS = 32, 8, 128, 16
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = {}
    for B, ctx in ((1, 256), (1, 4096), (64, 256), (256, 640)):
        nblk = -(-ctx // BS)
        blocks = B * nblk + 1
        k = torch.randn(blocks, HKV, D, BS, device=dev, dtype=torch.bfloat16)
        v = torch.randn(blocks, HKV, BS, D, device=dev, dtype=torch.bfloat16)
        tables = (torch.randperm(blocks - 1, device=dev)[: B * nblk] + 1).view(B, nblk).to(torch.int32)
        q = torch.randn(B, H, D, device=dev, dtype=torch.bfloat16)
        o = torch.empty_like(q)
        cu = torch.arange(B + 1, device=dev, dtype=torch.int32)
        lens = torch.full((B,), ctx, device=dev, dtype=torch.int32)
        kv_bytes = B * ctx * HKV * D * 2 * 2
        for n_sms in (0, sms):
            ms = gpu_ms(
                lambda q=q, k=k, v=v, o=o, t=tables, cu=cu, lens=lens, s=n_sms: tk.paged_attention(
                    q, k, v, o, t, cu, lens, D**-0.5, 1, s
                )
            )
            out[f"B{B}_ctx{ctx}_split{int(n_sms > 0)}"] = {
                "us": round(ms * 1e3, 2),
                "GBps": round(kv_bytes / (ms / 1e3) / 1e9, 1),
            }
        del k, v
        torch.cuda.empty_cache()
    return out


@section("gemm")
def _gemm():
    import torch.nn.functional as F

    shapes = {
        "qkv": (6144, 4096),
        "o": (4096, 4096),
        "gate_up": (28672, 4096),
        "down": (4096, 14336),
        "lm_head": (128256, 4096),
    }
    out = {}
    for name, (n, k_) in shapes.items():
        w = torch.randn(n, k_, device=dev, dtype=torch.bfloat16)
        for m in (1, 64, 256, 8192):
            x = torch.randn(m, k_, device=dev, dtype=torch.bfloat16)
            ms = gpu_ms(lambda x=x, w=w: F.linear(x, w), reps=10)
            out[f"{name}_M{m}"] = {
                "us": round(ms * 1e3, 1),
                "TBps_weights": round(n * k_ * 2 / (ms / 1e3) / 1e12, 2),
                "TFLOPs": round(2 * m * n * k_ / (ms / 1e3) / 1e12, 1),
            }
        del w
    return out


llm = None


@section("engine_build")
def _build():
    global llm
    from traceless import LLM

    t0 = time.perf_counter()
    llm = LLM(MODEL, load_format="dummy", device="cuda", max_num_seqs=256, max_num_batched_tokens=8192)
    m = llm.engine.model
    return {
        "build_s": round(time.perf_counter() - t0, 1),
        "graphs": m.cuda_graphs,
        "capture_s": m.capture_s,
        "kv_blocks": llm.engine.num_kv_blocks,
    }


def _params(n):
    from traceless import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@section("w1_steps")
def _w1():
    """Per decode step: wall time vs event span (events recorded around engine.step: the span still
    includes GPU idle while the host works inside the step, so wall - span ~ host time before the first launch)."""
    eng = llm.engine
    runner = eng._executor
    graphs = runner.graphs
    out = {}
    for mode in ("graphs", "eager"):
        runner.graphs = graphs if mode == "graphs" else None
        eng.add_request(f"w1-{mode}", list(range(1000, 1128)), _params(160))
        eng.step()  # prefill
        for _ in range(8):
            eng.step()
        walls, gpus = [], []
        for _ in range(64):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            a.record()
            eng.step()
            b.record()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3)
            gpus.append(a.elapsed_time(b))
        while eng.has_unfinished():
            eng.step()
        out[mode] = {
            "wall_ms": round(statistics.median(walls), 3),
            "event_ms": round(statistics.median(gpus), 3),
            "tok_s": round(1e3 / statistics.median(walls), 1),
        }
    runner.graphs = graphs
    if graphs is not None:  # CPU cost of one replay call and its GPU span
        n = graphs.sizes[0]
        cpu = []
        for _ in range(20):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graphs._graphs[n][0].replay()
            cpu.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        out["replay_size1"] = {
            "cpu_us": round(statistics.median(cpu), 1),
            "gpu_ms": round(gpu_ms(lambda: graphs._graphs[n][0].replay(), reps=10), 3),
        }
        runner.sweep()  # the replays above ran outside a step: the sweep zeroes what they left
    return out


@section("ttft")
def _ttft():
    """TTFT of a 128-token prompt with graphs on and off in one process; release timed apart."""
    eng = llm.engine
    runner = eng._executor
    graphs = runner.graphs
    rel_times = []
    real_release = runner.release

    def timed_release(rid):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        real_release(rid)
        torch.cuda.synchronize()
        rel_times.append((time.perf_counter() - t0) * 1e3)

    runner.release = timed_release
    real_sweep = runner.sweep

    def timed_sweep():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        real_sweep()
        torch.cuda.synchronize()
        rel_times.append((time.perf_counter() - t0) * 1e3)

    runner.sweep = timed_sweep
    out = {}
    try:
        for mode in ("graphs", "eager", "graphs"):
            runner.graphs = graphs if mode == "graphs" else None
            ttfts, ttfts_nosync = [], []
            for i in range(4):
                for synced in (True, False):
                    if synced:
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    eng.add_request(f"t-{mode}-{i}-{synced}", list(range(2000 + i, 2128 + i)), _params(16))
                    while not eng.step():
                        pass
                    (ttfts if synced else ttfts_nosync).append((time.perf_counter() - t0) * 1e3)
                    while eng.has_unfinished():
                        eng.step()
            out.setdefault(mode, []).append(
                {
                    "ttft_ms_synced": [round(x, 2) for x in ttfts],
                    "ttft_ms_after_release": [round(x, 2) for x in ttfts_nosync],
                }
            )
        out["release_and_sweep_ms"] = [round(x, 2) for x in rel_times]
    finally:
        runner.release = real_release
        runner.sweep = real_sweep
        runner.graphs = graphs
    return out


@section("async_ab")
def _async_ab():
    """Decode tok/s with asynchronous scheduling off and on, interleaved, in this process (the
    engine reads the switch every step): one stream, then 64 streams."""
    import dataclasses

    eng = llm.engine
    base = eng.config
    out = {}
    for batch in (1, 64):
        for rep in range(2):
            for ahead in (False, True):
                eng.config = dataclasses.replace(base, async_scheduling=ahead)
                for i in range(batch):
                    eng.add_request(
                        f"ab-{batch}-{rep}-{ahead}-{i}", [1000 + (i * 13 + j) % 30000 for j in range(128)], _params(136)
                    )
                for _ in range(8):  # prefill and warm decode steps
                    eng.step()
                torch.cuda.synchronize()
                t0, steps = time.perf_counter(), 0
                while steps < 96:
                    eng.step()
                    steps += 1
                torch.cuda.synchronize()
                out.setdefault(f"B{batch}_{'async' if ahead else 'sync'}_tok_s", []).append(
                    round(batch * steps / (time.perf_counter() - t0), 1)
                )
                while eng.has_unfinished():
                    eng.step()
    eng.config = base
    return out


def _profile(name, steps):
    from torch.profiler import ProfilerActivity, profile

    eng = llm.engine
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
    with open(os.path.join(OUT, f"diag_{TAG}_profile_{name}.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))
        f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=70))


@section("profile_b1")
def _p1():
    eng = llm.engine
    eng.add_request("p1", list(range(1000, 1128)), _params(64))
    for _ in range(10):
        eng.step()
    _profile("b1", 16)
    while eng.has_unfinished():
        eng.step()
    return "ok"


@section("w5_decode")
def _w5():
    """256 x 512-token prompts: per-step wall/GPU once everyone decodes, then a profile."""
    eng = llm.engine
    for i in range(256):
        eng.add_request(f"w5-{i}", [1000 + (i * 7 + j) % 30000 for j in range(512)], _params(64))
    t0 = time.perf_counter()
    steps = 0
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng._requests.values()):
        eng.step()
        steps += 1
    prefill_s = time.perf_counter() - t0
    walls, gpus = [], []
    for _ in range(12):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        a.record()
        eng.step()
        b.record()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t1) * 1e3)
        gpus.append(a.elapsed_time(b))
    _profile("b256", 6)
    t2 = time.perf_counter()
    while eng.has_unfinished():
        eng.step()
    return {
        "prefill_steps": steps,
        "prefill_s": round(prefill_s, 2),
        "decode_wall_ms": round(statistics.median(walls), 2),
        "decode_event_ms": round(statistics.median(gpus), 2),
        "tail_s": round(time.perf_counter() - t2, 2),
    }


save()
print("done", flush=True)
