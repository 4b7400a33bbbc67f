"""`traceless bench kv-offload`: throughput under memory pressure, offload vs recompute.

A workload that needs several times the KV cache it gets, so requests are preempted over and over:
with `--kv-offload none` a preempted request recomputes its prompt and output on resume; with
`memory` or `disk` its KV is sealed (AES-256-GCM) outside the pool and restored.
"""

from __future__ import annotations

import random
import shutil
import time

from traceless_tools.report.output import write_json

MODES = ("none", "memory", "disk")


def run(
    num_prompts: int, prompt_len: int, output_len: int, kv_mib: int, json_path: str | None, model: str | None = None
) -> dict:
    import tempfile

    from traceless.entrypoints.llm import LLM
    from traceless.sampling_params import SamplingParams

    rng = random.Random(0)
    prompts = [
        {"prompt_token_ids": [rng.randrange(1_000, 40_000) for _ in range(prompt_len)]} for _ in range(num_prompts)
    ]
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    rows = []
    for mode in MODES:
        spill = tempfile.mkdtemp(prefix="traceless-bench-kv-") if mode == "disk" else None
        llm = LLM(
            model,
            kv_cache_memory=kv_mib * 2**20,
            max_model_len=prompt_len + output_len + 16,
            kv_offload=mode,
            kv_offload_dir=spill,
        )
        llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=True)
        dt = time.perf_counter() - t0
        kv = llm.engine.kv_stats()
        rows.append(
            {
                "kv_offload": mode,
                "seconds": dt,
                "output_tokens_per_s": sum(len(o.outputs[0].token_ids) for o in outs) / dt,
                "preemptions": kv.preemptions,
                "swapped_mib": kv.offload_bytes_out / 2**20,
            }
        )
        llm.engine.check_integrity()
        del llm
        if spill is not None:  # empty by now: every spill file is unlinked when its request resumes or ends
            shutil.rmtree(spill, ignore_errors=True)
    report = {
        "benchmark": "kv-offload",
        "num_prompts": num_prompts,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "kv_cache_mib": kv_mib,
        "rows": rows,
    }
    print(f"\ntraceless bench kv-offload  {num_prompts} x ({prompt_len} in, {output_len} out), KV cache {kv_mib} MiB")
    print(f"{'kv offload':<12}{'seconds':>10}{'output tok/s':>14}{'preemptions':>13}{'sealed MiB':>12}")
    for r in rows:
        print(
            f"{r['kv_offload']:<12}{r['seconds']:>10.2f}{r['output_tokens_per_s']:>14.1f}{r['preemptions']:>13}{r['swapped_mib']:>12.1f}"
        )
    write_json(json_path, report)
    return report
