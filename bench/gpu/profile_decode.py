"""Where a decode step's time goes on the GPU: torch.profiler over 24 steps of one sequence
(W1's shape), top kernels by GPU time and the host's share. Usage:
    python3 bench/gpu/profile_decode.py bench/models/llama-3.1-8b"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from traceless import LLM, SamplingParams

llm = LLM(sys.argv[1], load_format="dummy", device="cuda", max_model_len=4096)
engine = llm.engine
params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
engine.add_request("p", list(range(1000, 1128)), params)
for _ in range(20):  # prefill and warm decode steps
    engine.step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(24):
    engine.step()
torch.cuda.synchronize()
print(f"decode step: {(time.perf_counter() - t0) / 24 * 1e3:.2f} ms (no profiler)")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(24):
        engine.step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60))
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
