"""The device limits a benchmark report divides by (bench/gpu_limits.py, offline.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceless_tools.bench.offline import _add_limit_ratios
from traceless_tools.bench.workloads import Workload

LIMITS = {"copy_bytes_per_s": 2.96e12, "bf16_flops_per_s": 7.71e14}
W1 = Workload("W1", "one stream", ((5,) * 128,), 128)
MODELS = Path(__file__).resolve().parents[2] / "bench" / "models"


def _report(model_dir) -> dict:
    report = {"dtype": "bfloat16", "limits": dict(LIMITS), "W1": {"decode_tokens_per_s": 150.0}}
    _add_limit_ratios(report, str(model_dir), ["W1"], {"W1": W1})
    return report


def test_a_decode_step_reads_every_weight_but_the_embedding_table():
    report = _report(MODELS / "llama-3.1-8b")
    embed = 128256 * 4096
    assert report["limits"]["parameters"] == 8_030_261_248
    assert report["limits"]["step_parameters"] == 8_030_261_248 - embed  # the LM head is untied: read whole
    read = 2 * (8_030_261_248 - embed)
    assert report["limits"]["weight_bytes"] == read
    assert report["W1"]["limit"]["decode_tokens_per_s"] == pytest.approx(2.96e12 / read)
    assert 196 < report["W1"]["limit"]["decode_tokens_per_s"] < 198  # 184 when the table was counted
    assert report["W1"]["ratio_to_limit"]["decode_tokens_per_s"] == pytest.approx(150.0 * read / 2.96e12)


def test_a_tied_table_is_read_whole_by_the_lm_head():
    assert '"tie_word_embeddings": true' in (MODELS / "llama-3.2-1b" / "config.json").read_text()
    report = _report(MODELS / "llama-3.2-1b")
    assert report["limits"]["step_parameters"] == report["limits"]["parameters"]
