# Sourced by the device scripts (run.sh, lease15.sh, smoke.sh) from the checkout root: the carried
# wheels go into the interpreter itself, not a --target folder (`traceless up` starts its nodes
# isolated, with a clean environment, so a PYTHONPATH entry would not reach them); then the synced
# tree in build/gpu16 (bench/gpu/sync.sh). `tl` runs the `traceless` console script's commands
# (the tools' command line: bench, audit and attack are not the core's).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
cd build/gpu16 || exit 1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
tl() { python3 -m traceless_tools.cli "$@" 2>&1 | grep -v '"event"'; }
M8=bench/models/llama-3.1-8b
M1=bench/models/llama-3.2-1b
