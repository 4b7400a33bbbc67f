"""What the same-run CPU table divides by (bench/cpu_limits.py): the bytes a decode step reads from a
GGUF file, the bytes a model's weights hold, and the agreement count of the greedy set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from traceless_tools.bench.cpu_limits import gguf_step_bytes, model_tensor_bytes
from traceless_tools.bench.greedy_set import agreement


def _write(path: Path, with_output: bool) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))  # 8 KiB
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((32, 32), dtype=np.float16))  # 2 KiB
    if with_output:
        writer.add_tensor("output.weight", np.zeros((64, 32), dtype=np.float16))  # 4 KiB
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_tied_embedding_table_is_read_whole_by_the_head(tmp_path):
    info = gguf_step_bytes(_write(tmp_path / "tied.gguf", with_output=False))
    assert info["tied_embeddings"]
    assert info["step_bytes"] == 64 * 32 * 4 + 32 * 32 * 2
    assert info["step_parameters"] == info["parameters"] == 64 * 32 + 32 * 32
    assert info["file_bytes"] > info["step_bytes"]


def test_an_untied_embedding_table_is_left_out_of_the_step(tmp_path):
    info = gguf_step_bytes(_write(tmp_path / "untied.gguf", with_output=True))
    assert not info["tied_embeddings"]
    assert info["step_bytes"] == 32 * 32 * 2 + 64 * 32 * 2
    assert info["parameters"] - info["step_parameters"] == 64 * 32


class _Layer:
    __slots__ = ("weight", "cache")

    def __init__(self, weight, cache):
        self.weight, self.cache = weight, cache


class _Model:
    def __init__(self):
        self.embed = torch.zeros(10, 4)  # 160 bytes
        head = self.embed  # tied: one storage, counted once
        self.layers = [_Layer(torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(1000)) for _ in range(2)]
        self.parts = (head, self.embed[:5])  # a view of the same storage
        self.cache = {"k": torch.zeros(1000)}  # the KV cache is not a weight


def test_weight_bytes_count_each_storage_once_and_leave_the_cache_out():
    assert model_tensor_bytes(_Model()) == 160 + 2 * 32


def test_agreement_counts_positions_and_refuses_ragged_lists():
    assert agreement([[1, 2, 3], [4]], [[1, 0, 3], [4]]) == pytest.approx(3 / 4)
    with pytest.raises(ValueError):
        agreement([[1, 2]], [[1]])
