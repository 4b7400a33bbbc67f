"""`traceless bench offline --json-schema`: one timed pass, free and constrained, on a tiny model."""

from __future__ import annotations

import json

from traceless.entrypoints.llm import LLM
from traceless.structured.spec import StructuredKind, StructuredOutput
from traceless_tools.bench.structured import _run
from traceless_tools.bench.workloads import Workload


def test_a_pass_constrained_and_free(byte_model_dir):
    engine = LLM(str(byte_model_dir), dtype="float32", kv_cache_memory=2**21, max_model_len=256).engine
    w = Workload("T", "tiny", ((40, 50, 60), (70, 80, 90, 100)), 60)
    schema = {
        "type": "object",
        "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 999}},
        "required": ["k"],
        "additionalProperties": False,
    }
    free, none = _run(engine, w, "free", None)
    assert free.output_tokens == 2 * 60 and none == [None, None]  # EOS ignored, nothing stops
    runs, texts = _run(engine, w, "json", StructuredOutput(StructuredKind.JSON_SCHEMA, json.dumps(schema)))
    assert runs.requests == 2 and runs.output_tokens < 2 * 60
    assert all(t is not None and 0 <= json.loads(t)["k"] <= 999 for t in texts)
    engine.check_integrity()
