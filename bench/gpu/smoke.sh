#!/bin/bash
# First device call: install the carried wheels, check imports, run the kernel and gpu tests, and a
# short dummy-weight benchmark. Run from the checkout root with the tree in build/gpu16.
source "$(dirname "$0")/env.sh"
nvidia-smi -L
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
python3 -m pytest -q -x -p no:cacheprovider tests/model/layers/test_triton_kernels.py tests/runner/test_cuda.py 2>&1 | tee $OUT/smoke_tests.log
python3 -m traceless_tools.cli bench offline --device cuda --model bench/models/llama-3.2-1b --load-format dummy \
  --workloads W1,W2 --repeats 1 --max-model-len 8192 --json $OUT/smoke_1b.json 2>&1 | grep -v '"event"' | tee $OUT/smoke_bench.log
