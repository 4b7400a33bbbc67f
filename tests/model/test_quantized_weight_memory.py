"""The built-in model's weights stay the size of its GGUF file in memory: GGML blocks are multiplied
as they are (no dequantized copy of any matrix, for any batch size), the tied embedding table is
read a row at a time from the same blocks, and what is dense (norms) is small.

Measured by walking the model executor's object graph (`engine._executor`) and summing the bytes of every
distinct tensor storage it holds, the KV cache left out (per-request memory, sized by its own
option). Required: <= the file's size + 10%."""

from __future__ import annotations

import gc

import pytest
import torch

from traceless import LLM


def resident_tensor_bytes(root: object, skip: tuple[str, ...] = ("KVCache",)) -> int:
    """Bytes of the distinct tensor storages reachable from root through traceless objects and
    containers (types named in `skip` are not entered)."""
    seen_obj: set[int] = set()
    storages: dict[int, int] = {}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen_obj:
            continue
        seen_obj.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.is_mkldnn:
                storages[id(obj)] = obj.numel() * obj.element_size()
            else:
                st = obj.untyped_storage()
                storages[st.data_ptr()] = st.nbytes()
            continue
        kind = type(obj)
        if kind.__name__ in skip:
            continue
        if isinstance(obj, (list, tuple, dict, set)) or kind.__module__.startswith("traceless"):
            stack.extend(gc.get_referents(obj))
    return sum(storages.values())


@pytest.mark.slow
def test_default_model_weights_take_no_more_than_the_file():
    from traceless.model.loader import default_model_path

    llm = LLM(kv_cache_memory=32 * 2**20, max_model_len=512)
    assert llm.engine.model.quantization == "gguf"
    held = resident_tensor_bytes(llm.engine._executor)
    size = default_model_path().stat().st_size
    print(f"weights held {held / 2**20:.1f} MiB, file {size / 2**20:.1f} MiB ({held / size:.3f})")
    assert 0.5 * size < held <= 1.10 * size
