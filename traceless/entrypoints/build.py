"""Build an engine from its configuration: the torch side (runner/build.py) first, then the engine
around it. The one place that imports both engine and runner."""

from __future__ import annotations

import time

from traceless.config import EngineConfig
from traceless.engine.llm_engine import LLMEngine
from traceless.events import emit


def build_engine(config: EngineConfig) -> LLMEngine:
    from traceless.runner.build import build_engine_parts  # torch lives behind this import

    t0 = time.monotonic()
    parts = build_engine_parts(config)
    engine = LLMEngine(config, parts)
    m = parts.model
    emit(
        "engine.ready",
        device=m.device,
        dtype=m.dtype,
        num_blocks=parts.kv_memory.num_blocks,
        block_size=config.block_size,
        max_model_len=m.max_model_len,
        load_s=time.monotonic() - t0,
        attention=m.attention,
        load_format=m.load_format,
        cuda_graphs=m.cuda_graphs,
        capture_s=m.capture_s,
        kv_cache_bytes=m.kv_cache_bytes,
        kv_cache_dtype=m.kv_cache_dtype,
        kv_sized_by=m.kv_sizing,
    )
    return engine
