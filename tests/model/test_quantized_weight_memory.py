"""The built-in model's weights stay the size of its GGUF file in memory: GGML blocks are multiplied
as they are (no dequantized copy of any matrix, for any batch size), the tied embedding table is
read a row at a time from the same blocks, and what is dense (norms) is small.

Measured as the benchmark does (traceless_tools/bench/cpu_limits.py `model_tensor_bytes`: the
distinct tensor storages the model object holds, the KV cache left out). Required: <= the file's
size + 10%."""

from __future__ import annotations

import pytest

from traceless import LLM
from traceless_tools.bench.cpu_limits import model_tensor_bytes


@pytest.mark.slow
def test_default_model_weights_take_no_more_than_the_file():
    from traceless.model.loader import default_model_path

    llm = LLM(kv_cache_memory=32 * 2**20, max_model_len=512)
    assert llm.engine.model.quantization == "gguf"
    held = model_tensor_bytes(llm.engine._executor.model)
    size = default_model_path().stat().st_size
    print(f"weights held {held / 2**20:.1f} MiB, file {size / 2**20:.1f} MiB ({held / size:.3f})")
    assert 0.5 * size < held <= 1.10 * size
