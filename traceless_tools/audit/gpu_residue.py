"""`traceless audit residue --device cuda`: what canary requests leave in device memory.

The engine runs in this process (device memory is only readable from the process that owns it:
the caching allocator hands freed blocks back to the same process, uncleared). Each canary is
first run alone: right after its prefill, its K and V rows (layer 0 and the last layer, a few
tokens, as stored in the cache) are copied to the host as needles, with its token ids (int32 and
int64 encodings). Then all canaries run again together through chunked prefill, preemption with
KV offload and an abort. When the engine is idle, two places are searched for every needle:

    KV pool      the cache tensors (freed blocks must be zero: K rows are strided there, so the
                 check is the non-zero block count plus a search for the V rows)
    free memory  all free device memory, taken with allocations until the device refuses more
                 (the allocator's cached free blocks first: where a step's temporaries went)
    graph pool   (CUDA graphs) the decode graphs' private memory pool, read in place: their
                 metadata, activations and outputs between replays

The CPU twin (--device cpu) runs the same search over the CPU KV pool and fresh host allocations;
the suite runs it. A search is aligned: token ids at 4 or 8 bytes, K/V rows at their element size.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from traceless.config import EngineConfig
from traceless.modes import CacheMode, DType, KVOffload, LoadFormat, as_mode
from traceless_tools.report.output import finish

CHUNK_BYTES = 256 * 2**20
SLICE_BYTES = 8 * 2**20
CHUNK_TOKENS = 128  # the audited engine's max_num_batched_tokens
_WORD = {2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True, slots=True)
class Needle:
    kind: str  # "token_ids" | "k_row" | "v_row"
    data: bytes
    word: int  # alignment and comparison width in bytes


@dataclass(frozen=True, slots=True)
class GpuResidueConfig:
    model: str
    load_format: str = "auto"
    device: str = "cuda"
    dtype: str = "auto"
    canaries: int = 4
    prompt_len: int = 300
    output_len: int = 24
    free_memory_limit: int | None = None  # bytes of free memory to take (None: all the device gives)


def count_hits(pool: torch.Tensor, needle: Needle) -> int:
    """Occurrences of `needle` in the uint8 tensor `pool` at offsets that are multiples of its word."""
    dtype = _WORD[needle.word]
    words = pool[: pool.numel() // needle.word * needle.word].view(dtype)
    ref = torch.frombuffer(bytearray(needle.data), dtype=dtype).to(pool.device)
    w = ref.numel()
    if words.numel() < w:
        return 0
    cand = torch.nonzero(words[: words.numel() - w + 1] == ref[0]).flatten()
    for j in range(1, w):
        if cand.numel() == 0:
            break
        cand = cand[words[cand + j] == ref[j]]
    return int(cand.numel())


def search(pool: torch.Tensor, needles: list[Needle], slice_bytes: int = SLICE_BYTES) -> dict[str, int]:
    """Hits per needle kind in `pool`, searched in overlapping slices (small temporaries)."""
    hits = {n.kind: 0 for n in needles}
    longest = max(len(n.data) for n in needles)
    for start in range(0, pool.numel(), slice_bytes):
        # overlap by the longest needle so that nothing straddling a slice edge is missed (or counted twice:
        # a hit is counted in the slice where it starts)
        piece = pool[start : min(start + slice_bytes + longest, pool.numel())]
        for n in needles:
            total = count_hits(piece, n)
            tail = count_hits(piece[slice_bytes:], n) if piece.numel() > slice_bytes else 0
            hits[n.kind] += total - tail
    return hits


def _ids_needles(ids: list[int]) -> list[Needle]:
    head = ids[:8]
    return [
        Needle("token_ids", torch.tensor(head, dtype=t).numpy().tobytes(), w)
        for t, w in ((torch.int32, 4), (torch.int64, 8))
    ]


def kv_needles(cache, blocks: list[int], rows: int = 4) -> list[Needle]:
    """K and V rows of the first `rows` nonzero token slots of `blocks`, layers 0 and last, head 0,
    contiguous as a temporary holds them (K: post-RoPE row; V: row)."""
    out = []
    elem = cache.k.element_size()
    for layer in sorted({0, cache.k.shape[0] - 1}):
        taken = 0
        for b in blocks:
            for off in range(cache.block_size):
                k = cache.k[layer, b, 0, :, off].contiguous().cpu()
                v = cache.v[layer, b, 0, off].contiguous().cpu()
                if taken < rows and k[0] != 0 and v[0] != 0:
                    out += [
                        Needle("k_row", k.view(torch.uint8).numpy().tobytes(), elem),
                        Needle("v_row", v.view(torch.uint8).numpy().tobytes(), elem),
                    ]
                    taken += 1
    return out


def take_free_memory(device: torch.device, limit: int | None) -> list[torch.Tensor]:
    """Allocate free memory in chunks (halving the chunk when refused, down to 2 MiB) until the
    device gives no more or `limit` bytes are taken."""
    chunks: list[torch.Tensor] = []
    size, taken = CHUNK_BYTES, 0
    while size >= 2**21 and (limit is None or taken < limit):
        try:
            chunks.append(torch.empty(size, dtype=torch.uint8, device=device))
            taken += size
        except (torch.OutOfMemoryError, RuntimeError):
            size //= 2
    return chunks


def _kv_budget(cfg: GpuResidueConfig, ec: EngineConfig) -> int:
    """Room for about two and a half canaries at once, so that the others are preempted (and
    sealed by the KV offload); 64 MiB when the model's shapes are not in a config.json."""
    from pathlib import Path

    from traceless.errors import TracelessError
    from traceless.model.dummy import read_dummy_config
    from traceless.model.layers.kv_cache import block_bytes
    from traceless.runner.build import cache_dtype
    from traceless.runner.kv_budget import group_blocks

    try:
        config = read_dummy_config(Path(cfg.model))
    except (TracelessError, OSError):
        return 64 * 2**20
    per_block = block_bytes(config, 16, cache_dtype(ec))
    # one canary's blocks over the model's KV groups (a windowed group's stay near its window)
    per_canary = group_blocks(cfg.prompt_len + cfg.output_len, 1, 16, config.kv_groups.windows, CHUNK_TOKENS)
    return per_block * (per_canary * 5 // 2 + 1)


def _engine(cfg: GpuResidueConfig):
    from traceless.engine.llm_engine import LLMEngine
    from traceless.runner.build import build_engine_parts

    ec = EngineConfig(
        model=cfg.model,
        load_format=as_mode("load_format", LoadFormat, cfg.load_format),
        device=cfg.device,
        dtype=as_mode("dtype", DType, cfg.dtype),
        max_model_len=cfg.prompt_len + cfg.output_len,
        prefix_cache=CacheMode.OFF,
        max_num_batched_tokens=CHUNK_TOKENS,
        kv_offload=KVOffload.MEMORY,
        max_num_seqs=8,
    )
    ec = replace(ec, kv_cache_memory=_kv_budget(cfg, ec))
    parts = build_engine_parts(ec)
    graphs = getattr(parts.executor, "graphs", None)
    return LLMEngine(ec, parts), parts.kv_memory, graphs.pool if graphs is not None else None


class _DeviceBytes:
    """A device byte range as __cuda_array_interface__, for a tensor that aliases it (no copy)."""

    def __init__(self, address: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (address, False), "version": 3}


def graph_pool_views(device: torch.device, pool: tuple[int, int] | None) -> list[torch.Tensor]:
    """The decode graphs' private pool, segment by segment, as uint8 tensors aliasing it: what
    the graphs' buffers (inputs, activations, outputs) hold between replays."""
    if pool is None:
        return []
    index = device.index if device.index is not None else torch.cuda.current_device()
    return [
        torch.as_tensor(_DeviceBytes(seg["address"], seg["total_size"]), device=device)
        for seg in torch.cuda.memory_snapshot()
        if seg.get("device") == index and tuple(seg.get("segment_pool_id", (0, 0))) == tuple(pool)
    ]


def _canary_prompts(cfg: GpuResidueConfig, vocab: int) -> list[list[int]]:
    rng = random.SystemRandom()
    return [[rng.randrange(1_000, min(vocab, 40_000)) for _ in range(cfg.prompt_len)] for _ in range(cfg.canaries)]


def _needles_of(engine, cache, prompt: list[int], params) -> list[Needle]:
    """Run one canary alone; right after its prefill, copy its K/V rows out as needles."""
    engine.add_request("needle", list(prompt), params)
    needles: list[Needle] = []
    while engine.has_unfinished():
        outs = engine.step()
        if outs and not needles:
            needles = kv_needles(cache, sorted(cache.nonzero_blocks()))
    return needles + _ids_needles(prompt)


def _run_paths(engine, prompts: list[list[int]], params) -> None:
    """All canaries at once: chunked prefill, preemption with sealed offload; the last is aborted."""
    for i, p in enumerate(prompts):
        engine.add_request(f"canary-{i}", list(p), params)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if steps == 6:
            engine.abort(f"canary-{len(prompts) - 1}")


def run(cfg: GpuResidueConfig, json_path: str | None = None) -> dict:
    from traceless.sampling_params import SamplingParams

    device = torch.device(cfg.device)
    engine, cache, graph_pool = _engine(cfg)
    params = SamplingParams(temperature=0.0, max_tokens=cfg.output_len, ignore_eos=True)
    prompts = _canary_prompts(cfg, engine.model.vocab_size)
    needles = [n for p in prompts for n in _needles_of(engine, cache, p, params)]
    _run_paths(engine, prompts, params)
    engine.check_integrity()
    pool_hits = search(
        torch.cat([cache.k.reshape(-1).view(torch.uint8), cache.v.reshape(-1).view(torch.uint8)]),
        [n for n in needles if n.kind == "v_row"],
    )
    graph_hits = {n.kind: 0 for n in needles}
    views = graph_pool_views(device, graph_pool)
    for view in views:
        for kind, n in search(view, needles).items():
            graph_hits[kind] += n
    graph_bytes = sum(v.numel() for v in views)
    del views
    workspace = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)  # search scratch, taken first
    chunks = take_free_memory(device, cfg.free_memory_limit)
    free_hits = search(workspace.cpu(), needles)
    del workspace
    taken = sum(c.numel() for c in chunks) + 64 * 2**20
    for c in chunks:
        for kind, n in search(c, needles).items():
            free_hits[kind] += n
    del chunks
    report = {
        "audit": "residue",
        "device": cfg.device,
        "model": engine.model_name,
        "load_format": cfg.load_format,
        "canaries": cfg.canaries,
        "needles": {k: sum(1 for n in needles if n.kind == k) for k in free_hits},
        "kv_pool": {"nonzero_blocks": len(cache.nonzero_blocks()), "v_row_hits": pool_hits.get("v_row", 0)},
        "free_memory": {"bytes_searched": taken, "hits": free_hits},
        "graph_pool": {"bytes_searched": graph_bytes, "hits": graph_hits},
    }
    if device.type == "cuda":
        report["device_name"] = torch.cuda.get_device_name(device)
    report["clean"] = (
        report["kv_pool"]["nonzero_blocks"] == 0
        and not any(free_hits.values())
        and not report["kv_pool"]["v_row_hits"]
        and not any(graph_hits.values())
    )
    return finish(report, print_report, json_path)


def print_report(r: dict) -> None:
    print(
        f"\ntraceless audit residue  device={r['device']}  model={r['model']}  load_format={r['load_format']}  "
        f"canaries={r['canaries']}"
    )
    print(f"  needles: {r['needles']}")
    print(f"  KV pool: {r['kv_pool']['nonzero_blocks']} non-zero blocks, {r['kv_pool']['v_row_hits']} V-row hits")
    gib = r["free_memory"]["bytes_searched"] / 2**30
    print(f"  free memory ({gib:.1f} GiB searched): hits {r['free_memory']['hits']}")
    g = r["graph_pool"]
    print(f"  decode graphs' pool ({g['bytes_searched'] / 2**20:.1f} MiB searched): hits {g['hits']}")
    print(f"  clean: {r['clean']}")
