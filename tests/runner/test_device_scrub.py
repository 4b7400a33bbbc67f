"""The CUDA path's release-time scrub, on the GPU where there is one, else on a CPU: the
range-zeroing kernel (under Triton's interpreter on a CPU, where it writes host addresses), the
ranges a sweep builds (freed KV blocks, the allocator's free blocks from a stand-in memory
snapshot, the graphs' pool), and the engine calling one sweep per step however many requests
ended."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tests.support.fake_snapshot import segment  # noqa: E402
from traceless.model.config import ModelConfig  # noqa: E402
from traceless.model.hf_config import from_hf_config  # noqa: E402
from traceless.model.layers.kv_cache import KVCache  # noqa: E402
from traceless.runner import zero_kernel  # noqa: E402
from traceless.runner.device_scrub import DeviceScrubber, free_ranges, kv_block_ranges  # noqa: E402

CPU = torch.device("cpu")
# the kernel writes the addresses it is given: device memory on a GPU, host memory when interpreted
DEV = torch.device("cuda") if torch.cuda.is_available() else CPU


def _config() -> ModelConfig:
    return from_hf_config(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 64,
        }
    )


def test_pieces_cut_ranges_into_chunks(monkeypatch):
    monkeypatch.setattr(zero_kernel, "CHUNK_WORDS", 4)
    p = zero_kernel.pieces(np.array([[1024, 8 * 10], [4096, 8 * 4], [8000, 0]]))
    assert p.tolist() == [[1024, 4], [1056, 4], [1088, 2], [4096, 4]]
    for bad in ([1032, 16], [1024, 8]):  # 16-byte stores: aligned and whole 16-byte units only
        with pytest.raises(ValueError):
            zero_kernel.pieces(np.array([bad]))


def test_one_launch_zeroes_every_range_and_nothing_else(monkeypatch):
    monkeypatch.setattr(zero_kernel, "CHUNK_WORDS", 64)  # many pieces per range
    a = torch.randn(1000, dtype=torch.float64, device=DEV)
    b = torch.randn(300, device=DEV)
    z = zero_kernel.RangeZeroer(DEV)
    ranges = np.array([[a.data_ptr() + 8 * 10, 8 * 900], [b.data_ptr(), 4 * 300]])
    z.reserve(len(zero_kernel.pieces(ranges)))
    assert z.zero(ranges) == 8 * 900 + 4 * 300
    assert z.launches == 1
    assert a[10:910].abs().sum() == 0 and bool((a[:10] != 0).all()) and bool((a[910:] != 0).all())
    assert b.abs().sum() == 0


def test_kv_block_ranges_cover_the_blocks_in_every_layer():
    cache = KVCache(_config(), num_blocks=6, block_size=4, dtype=torch.float32, device=DEV)
    cache.k.normal_()
    cache.v.normal_()
    z = zero_kernel.RangeZeroer(DEV)
    r = kv_block_ranges(cache, [2, 5])
    z.reserve(len(zero_kernel.pieces(r)))
    z.zero(r)
    assert cache.nonzero_blocks() == {0, 1, 3, 4}


def test_free_ranges_take_inactive_default_blocks_and_whole_graph_pools():
    segments = [
        segment(0, 1 << 20, (0, 0), [(512, "active_allocated"), (1024, "inactive"), (512, "inactive")]),
        segment(0, 1 << 24, (0, 1), [(4096, "active_allocated")], total=8192),
        segment(1, 1 << 28, (0, 0), [(512, "inactive")]),  # another device
        segment(0, 1 << 26, (0, 2), [(512, "inactive")]),
    ]  # a private pool that is not ours
    got = free_ranges(segments, 0, {(0, 1)})
    assert got.tolist() == [[(1 << 20) + 512, 1024], [(1 << 20) + 1536, 512], [1 << 24, 8192]]


def test_a_sweep_zeroes_freed_blocks_and_free_memory_in_one_launch():
    cache = KVCache(_config(), num_blocks=6, block_size=4, dtype=torch.float32, device=DEV)
    stale = torch.randn(256, dtype=torch.float64, device=DEV)  # a freed activation, say
    graph_pool = torch.randn(128, dtype=torch.float64, device=DEV)
    segs = [
        segment(0, stale.data_ptr(), (0, 0), [(8 * 256, "inactive")]),
        segment(0, graph_pool.data_ptr(), (0, 7), [(8 * 128, "active_allocated")]),
    ]
    scrubber = DeviceScrubber(cache, DEV, snapshot=lambda: segs)
    scrubber.graph_pools.add((0, 7))
    cache.k.normal_()
    cache.v.normal_()
    cache.zero_blocks([1, 4])  # deferred: the blocks keep their values until the sweep
    cache.zero_blocks([2])
    assert cache.k[:, 1].abs().sum() > 0  # deferred to the sweep
    scrubber.step_ran()
    scrubber.request_ended()
    scrubber.sweep()
    assert scrubber.zeroer.launches == 1
    assert stale.abs().sum() == 0 and graph_pool.abs().sum() == 0
    assert cache.nonzero_blocks() == {0, 3, 5}
    assert scrubber.sweep() == 0 and scrubber.zeroer.launches == 1  # nothing pending: no launch


def test_a_read_of_the_cache_zeroes_pending_blocks_first():
    cache = KVCache(_config(), num_blocks=4, block_size=4, dtype=torch.float32, device=CPU)
    cache.defer_zeroing()
    cache.k.normal_()
    cache.v.normal_()
    cache.zero_blocks([2])
    assert cache.nonzero_blocks() == {0, 1, 3}


def test_the_engine_sweeps_once_per_step_however_many_requests_end(tiny_llama_dir):
    from tests.conftest import ExecutorSpy, llm_with_executor
    from traceless import SamplingParams
    from traceless.config import EngineConfig

    sweeps = []

    class Counting(ExecutorSpy):
        def sweep(self):
            sweeps.append(1)
            super().sweep()

    llm = llm_with_executor(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20), Counting)
    engine = llm.engine
    for i in range(4):  # four requests ending at the same step
        engine.add_request(f"r{i}", [5 + i, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    assert len(sweeps) == steps
    engine.check_integrity()
