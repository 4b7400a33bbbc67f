"""The bench/models configs of the mixture-of-experts and 70B models build, in transformers (on
the meta device: shapes only), models of the published sizes: a check that the configs copied
from the hub hold no typo. Total and active (per token) parameters in billions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

MODELS = Path(__file__).resolve().parents[2] / "bench" / "models"
PUBLISHED = {  # name: (total, active, experts, top k, active counted without the embedding table)
    "mixtral-8x7b": (46.70, 12.88, 8, 2, False),
    "qwen3-30b-a3b": (30.53, 3.35, 128, 8, False),
    "gpt-oss-20b": (20.91, 3.61, 32, 4, True),  # OpenAI's model card counts it so
    "llama-3.1-70b": (70.55, 70.55, 0, 0, False),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_bench_config_builds_a_model_of_the_published_size(name):
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = json.loads((MODELS / name / "config.json").read_text())
    raw.pop("quantization_config", None)  # gpt-oss: MXFP4 experts; the count is of parameters, not bytes
    config = AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    total_b, active_b, num_experts, top_k, without_embedding = PUBLISHED[name]
    active = total - (experts * (1 - top_k / num_experts) if num_experts else 0)
    if without_embedding:
        active -= model.get_input_embeddings().weight.numel()
    assert abs(total / 1e9 - total_b) < 0.01
    assert abs(active / 1e9 - active_b) < 0.01
