"""Compile the paged-attention kernel (and the scrub's zeroing kernel) ahead of time for an H100
(sm_90) with Triton's own ptxas, on any machine (no GPU needed), and report per configuration:
registers per thread, spills, and the global loads the PTX issues by width (16-byte `v4` loads
and asynchronous copies are what a pipelined kernel uses; `b16` loads are one bf16 element
each). Llama-3.1-8B's attention shape: 32 query heads, 8 KV heads, head_dim 128, block size 16,
bf16. Usage (not under TRITON_INTERPRET):
    PYTHONPATH=. python3 bench/gpu/aot_registers.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from traceless.model.layers import triton_kernels as tk

# (name, constexprs) as paged_attention picks them: a decode tile (16 rows: 4 query heads of one
# token, padded), split or not, and a prefill tile of 64 rows (16 tokens x 4 heads).
# num_warps as paged_attention launches them (8 for the 64-row tile).
CONFIGS = [
    ("decode", dict(BLOCK_Q=4, BLOCK_M=16, SPLITS=1), 4),
    ("decode-split8", dict(BLOCK_Q=4, BLOCK_M=16, SPLITS=8), 4),
    ("prefill", dict(BLOCK_Q=16, BLOCK_M=64, SPLITS=1), 8),
]
SHAPE = dict(G=4, D=128, D_PAD=128, BS=16, BLOCK_N=64, PRECISION="tf32")
INTS = dict(
    q_stride_t=6144,
    q_stride_h=128,
    o_stride_t=4096,
    o_stride_h=128,
    k_stride_b=16384,
    k_stride_h=2048,
    v_stride_b=16384,
    v_stride_h=2048,
    tables_stride=512,
    T=64,
    H=32,
)
FLOAT_PTRS = ("part_ptr", "ml_ptr")
INT_PTRS = ("tables_ptr", "cu_q_ptr", "ctx_ptr")


def _source(extra: dict) -> ASTSource:
    sig, attrs = {}, {}
    names = list(tk._paged_attention_kernel.arg_names)
    consts = SHAPE | extra
    for i, n in enumerate(names):
        if n in consts:
            sig[n] = "constexpr"
        elif n.endswith("_ptr"):
            sig[n] = "*fp32" if n in FLOAT_PTRS else "*i32" if n in INT_PTRS else "*bf16"
            attrs[(i,)] = [["tt.divisibility", 16]]  # the runtime aligns every pointer it passes
        elif n == "scale":
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
            if INTS[n] % 16 == 0 and n not in _unspecialized():
                attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(tk._paged_attention_kernel, sig, consts, attrs)


def _unspecialized() -> set[str]:
    """Integer arguments the kernel's jit decorator leaves unspecialized (no divisibility hint)."""
    return {str(n) for n in getattr(tk._paged_attention_kernel, "do_not_specialize", None) or []}


def compile_report(name: str, extra: dict, num_warps: int) -> dict:
    k = triton.compile(
        _source(extra), target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": 3}
    )
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [os.path.join(bindir, "cuobjdump"), "--dump-resource-usage", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    ptx = k.asm["ptx"]
    loads = {w: len(re.findall(rf"ld\.global(?:\.\w+)*\.{w}\b", ptx)) for w in ("v4", "v2")}
    loads["scalar_b16"] = len(re.findall(r"ld\.global(?:\.\w+)*\.b16\b", ptx))
    loads["cp_async"] = len(re.findall(r"cp\.async", ptx))
    return {
        "config": name,
        "num_warps": num_warps,
        "registers": int(regs.group(1)) if regs else None,
        "stack_bytes": int(stack.group(1)) if stack else None,
        "shared_bytes": k.metadata.shared,
        "loads": loads,
    }


def zero_kernel_report() -> dict:
    """The scrub's range-zeroing kernel: its stores should be 16 bytes wide (st.global.v2.b64)."""
    from traceless.runner import zero_kernel

    src = ASTSource(
        zero_kernel._zero_ranges_kernel,
        {"ranges_ptr": "*i64", "BLOCK": "constexpr"},
        {"BLOCK": zero_kernel._BLOCK},
        {(0,): [["tt.divisibility", 16]]},
    )
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return {"stores": sorted(set(re.findall(r"st\.global[\w.]*", k.asm["ptx"])))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    out = {
        "triton": triton.__version__,
        "target": "sm_90",
        "shape": SHAPE,
        "kernels": [compile_report(*c) for c in CONFIGS],
        "zero_ranges": zero_kernel_report(),
    }
    for r in out["kernels"]:
        print(
            f"{r['config']:<14} warps {r['num_warps']}  registers {r['registers']:>4}  "
            f"stack {r['stack_bytes']:>4} B  shared {r['shared_bytes']:>6} B  loads {r['loads']}"
        )
    print(f"zero_ranges    stores {out['zero_ranges']['stores']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
