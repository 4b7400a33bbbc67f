#!/bin/bash
# The second device lease (after lease15.sh): what that lease could not fit. The privacy tax with
# 64 requests per prompt class and path (so its interval is narrower than the effect), W5 on the
# Llama-3.1-8B shape (256 x 512-token prompts), and the families the Triton attention gained
# (Gemma 2's soft-capping, gpt-oss's sinks) against transformers. Same setup as lease15.sh
# (bench/gpu/sync.sh; carry build/gpu16 and .whl). Each section has its own limit; ~9 minutes.
source "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee $OUT/gpu_device.txt
timeout 60 python3 -c "import json, torch
from traceless_tools.bench.gpu_limits import measure_limits
print(json.dumps({'device': torch.cuda.get_device_name(), **measure_limits(torch.device('cuda'))}))" \
  2>&1 | tee $OUT/gpu_limits.json
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/runner/test_cuda.py -k "gemma2 or oss" \
  2>&1 | tail -20 | tee $OUT/gpu_families.log
timeout 150 bash -c "$(declare -f tl); tl bench offline --device cuda --model $M8 --load-format dummy \
  --workloads W5 --repeats 1 --max-num-seqs 256 --max-model-len 4096 --async-scheduling \
  --json $OUT/gpu_offline_llama-3.1-8b_w5.json"
timeout 300 bash -c "$(declare -f tl); tl bench privacy-tax --device cuda --load-format dummy --model $M1 \
  --requests 64 --concurrency 16 --repeats 1 --output-len 64 --json $OUT/gpu_privacy_tax.json"
