#!/bin/bash
# The full device call: gpu tests, the offline benchmark on Llama-3.1-8B and Llama-3.2-1B shapes
# (dummy weights) with the device's limits and transformers side by side, synchronous and with
# --async-scheduling, the diagnostics (host vs device time per step, TTFT graphs vs eager, async
# A/B), the device residue audit, and the privacy tax on the GPU. JSON under $OUT
# (bench/results/<device>/ in the repo). Run from the checkout root with this tree in build/gpu16
# and the wheels in .whl (bench/gpu/sync.sh). Sections in order of what the GPU measurements need
# first; each writes its own file, so a run cut short by the time limit keeps what it finished.
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pytest -q -p no:cacheprovider tests/model/layers/test_triton_kernels.py tests/runner/test_cuda.py \
  tests/runner/test_graph_scrub.py tests/runner/test_device_scrub.py tests/runner/test_triton_recompile.py \
  tests/audit/test_gpu_residue.py 2>&1 | tail -15 | tee $OUT/gpu_tests.log
# W1 single stream and TTFT, W2 (64 x 128/128), W5 (256 x 512/128): synchronous, then run ahead
tl bench offline --device cuda --model $M8 --load-format dummy --workloads W1,W2,W3,W5 \
  --repeats 3 --max-num-seqs 256 --max-num-batched-tokens 8192 --peer hf --json $OUT/gpu_offline_llama-3.1-8b.json
tl bench offline --device cuda --model $M8 --load-format dummy --workloads W1,W2,W5 --async-scheduling \
  --repeats 3 --max-num-seqs 256 --max-num-batched-tokens 8192 --json $OUT/gpu_offline_llama-3.1-8b_async.json
OUT=$OUT python3 bench/gpu/gpu_diag.py $M8 2>&1 | cut -c1-300 | tee $OUT/gpu_diag.log
tl audit residue --device cuda --model $M1 --load-format dummy --json $OUT/gpu_residue.json
tl bench offline --device cuda --model $M1 --load-format dummy --workloads W1,W2 \
  --repeats 3 --json $OUT/gpu_offline_llama-3.2-1b.json
# (--enforce-eager: the same command with --workloads W1,W2 --enforce-eager; results/h100 holds one)
python3 bench/gpu/profile_decode.py $M8 2>&1 | grep -v "\"event\"" | tee $OUT/gpu_profile_decode.txt
# the privacy tax with enough requests per class that its interval is narrower than a 3% effect
tl bench privacy-tax --device cuda --load-format dummy --model $M8 --requests 64 --concurrency 16 --repeats 2 \
  --output-len 64 --json $OUT/gpu_privacy_tax.json
