#!/bin/bash
# The full device call: gpu tests, the offline benchmark on Llama-3.1-8B and Llama-3.2-1B shapes
# (dummy weights) with the device's limits and transformers side by side, the device residue
# audit, and the privacy tax on the GPU. JSON under $OUT (bench/results/h100/ in the repo).
# Run from the checkout root with this tree in build/gpu16 and the wheels in .whl (bench/gpu/sync.sh).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cd build/gpu16 || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
tl() { python3 -m traceless.cli "$@" 2>&1 | grep -v '"event"'; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pytest -q -p no:cacheprovider tests/model/layers/test_triton_kernels.py tests/runner/test_cuda.py \
  tests/audit/test_gpu_residue.py 2>&1 | tail -15 | tee $OUT/gpu_tests.log
tl bench offline --device cuda --model bench/models/llama-3.1-8b --load-format dummy --workloads W1,W2,W3,W5 \
  --repeats 3 --max-num-seqs 256 --max-num-batched-tokens 8192 --peer hf --json $OUT/gpu_offline_llama-3.1-8b.json
tl bench offline --device cuda --model bench/models/llama-3.2-1b --load-format dummy --workloads W1,W2 \
  --repeats 3 --json $OUT/gpu_offline_llama-3.2-1b.json
# (--enforce-eager: the same command with --workloads W1,W2 --enforce-eager; results/h100 holds one)
tl audit residue --device cuda --model bench/models/llama-3.2-1b --load-format dummy --json $OUT/gpu_residue.json
python3 bench/gpu/profile_decode.py bench/models/llama-3.1-8b 2>&1 | grep -v "\"event\"" | tee $OUT/gpu_profile_decode.txt
tl bench privacy-tax --device cuda --load-format dummy --model bench/models/llama-3.1-8b --quick \
  --json $OUT/gpu_privacy_tax.json
