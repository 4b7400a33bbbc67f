"""The fault audit's KV offload: nodes whose KV cache is small enough that the audit's load preempts
and spills, a tmpfs with room for every spill, and the spills counted from the nodes' own events.

The cache holds CONTEXT_TOKENS tokens, one full-length request (the least a node accepts), and the
load's answers run to the end of the context (no max_tokens, EOS ignored): whenever two requests
overlap at a node, they outgrow the cache and the newest is preempted, its KV sealed and spilled to
the offload directory. The count is read
from the `engine.preempted` events (`spilled`: how many of the preempted requests were sealed) and
`engine.kv_spill_failed` events of every node's event log: aggregates of a step, no request's own
figure.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

CONTEXT_TOKENS = 128
LOAD_MAX_TOKENS = None  # the load's answers run to the end of the context (fault_load.Load)
WORKERS_ROOM = 16  # the tmpfs holds this many full-context requests' sealed KV (the load runs 8)
MIN_TMPFS_BYTES = 2**20


@dataclass(frozen=True, slots=True)
class OffloadSizing:
    node_args: tuple[str, ...]  # appended to the nodes' options (later options win)
    tmpfs_bytes: int


def offload_sizing(model: str | None, node_args: tuple[str, ...]) -> OffloadSizing:
    """The options that give nodes of `model` (under `node_args`: dtype, device, block size, cache dtype) a cache
    of CONTEXT_TOKENS tokens, and the tmpfs size for their spills."""
    from traceless.cli.engine_args import add_engine_args
    from traceless.config import EngineConfig
    from traceless.model.loader import read_model_config
    from traceless.runner.build import cache_dtype

    parser = argparse.ArgumentParser(add_help=False)
    add_engine_args(parser)
    opts, _ = parser.parse_known_args(list(node_args))
    dtype = cache_dtype(
        EngineConfig(
            model=model,
            dtype=opts.dtype,
            device=opts.device,
            quantization=opts.quantization,
            load_format=opts.load_format,
            attention_backend=opts.attention_backend,
            kv_cache_dtype=opts.kv_cache_dtype,
        )
    )
    per_token = read_model_config(model).kv_bytes_per_token * dtype.itemsize
    blocks = -(-CONTEXT_TOKENS // opts.block_size) + 1  # + the null block
    cache = blocks * opts.block_size * per_token
    tmpfs = max(MIN_TMPFS_BYTES, -(-WORKERS_ROOM * CONTEXT_TOKENS * per_token // 2**20) * 2**20)
    return OffloadSizing(("--kv-cache-memory", str(cache), "--max-model-len", str(CONTEXT_TOKENS)), tmpfs)


@dataclass(frozen=True, slots=True)
class SpillCounts:
    spilled: int  # preempted requests whose KV was sealed into the offload directory
    failed: int  # preempted requests whose KV could not be written (the directory full)

    def __sub__(self, other: SpillCounts) -> SpillCounts:
        return SpillCounts(self.spilled - other.spilled, self.failed - other.failed)


def spill_counts(logs: Path) -> SpillCounts:
    """Totals over every node's event log in `logs` (node0.log, node1.log, ...; a restarted node
    appends to its file)."""
    spilled = failed = 0
    for path in sorted(logs.glob("node*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith('{"ts"'):
                continue
            if '"engine.preempted"' in line:
                spilled += json.loads(line).get("spilled", 0)
            elif '"engine.kv_spill_failed"' in line:
                failed += json.loads(line).get("num_requests", 0)
    return SpillCounts(spilled, failed)
