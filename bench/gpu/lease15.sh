#!/bin/bash
# A 15-minute device lease in one call (~9 minutes of command): the machine's limits (copy
# bandwidth, bf16 matmul), the gpu tests, the offline benchmark on the Llama-3.1-8B shape (W1, W2),
# the device residue audit and the privacy tax on the 1B shape. Each section has its own time limit
# and writes its own file under $OUT, so a slow section costs only itself. Run from the checkout
# root with the tree in build/gpu16 and the wheels in .whl (bench/gpu/sync.sh); carry both.
# The wheels: gguf starlette uvicorn httptools cryptography cffi pycparser llguidance (env.sh).
# Seen on an H100 on 2026-11-27 (bench/results/h100-2026-11-27): limits ~10 s, tests ~150 s, W1/W2
# on 8B ~60 s, residue audit ~60 s; the privacy tax needs more than 170 s (run it in its own call).
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee $OUT/gpu_device.txt
timeout 60 python3 -c "import json, torch
from traceless_tools.bench.gpu_limits import measure_limits
print(json.dumps({'device': torch.cuda.get_device_name(), **measure_limits(torch.device('cuda'))}))" \
  2>&1 | tee $OUT/gpu_limits.json
timeout 210 python3 -m pytest -q -p no:cacheprovider --durations=10 tests/runner/test_graph_scrub.py \
  tests/runner/test_device_scrub.py tests/runner/test_cuda.py tests/model/layers/test_triton_kernels.py \
  tests/runner/test_cuda_graphs.py tests/runner/test_triton_recompile.py tests/model/layers/test_moe_triton.py \
  tests/model/fp8/test_linear.py tests/audit/test_gpu_residue.py 2>&1 | tail -60 | tee $OUT/gpu_tests.log
for mode in sync async; do
  timeout 120 bash -c "$(declare -f tl); tl bench offline --device cuda --model $M8 --load-format dummy \
    --workloads W1,W2 --repeats 2 --max-num-seqs 64 --max-model-len 4096 $([ $mode = async ] && echo --async-scheduling) \
    --json $OUT/gpu_offline_llama-3.1-8b_$mode.json"
done
timeout 120 bash -c "$(declare -f tl); tl audit residue --device cuda --model $M1 --load-format dummy \
  --json $OUT/gpu_residue.json"
timeout 400 bash -c "$(declare -f tl); tl bench privacy-tax --device cuda --load-format dummy --model $M1 \
  --requests 32 --concurrency 16 --repeats 1 --output-len 64 --json $OUT/gpu_privacy_tax.json"
