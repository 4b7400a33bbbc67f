"""`--peer hf`: Hugging Face transformers `generate` on the same dummy weights and prompts, in the
same run, for a side-by-side table.

The weights are drawn again from the same seed on the same device (model/dummy.py is
deterministic there) and copied tensor by tensor into a transformers model built from the same
config.json, so both engines compute the same function. Greedy, fixed output length
(min_new_tokens = max_new_tokens), each workload as one static batch (its prompts are all of one
length, so no padding), SDPA attention, the dynamic KV cache: transformers' defaults.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from traceless.model.dummy import iter_dummy_weights, read_dummy_config
from traceless.model.hf_loader import canonical_name
from traceless_tools.bench.workloads import Workload


def _hf_names(num_layers: int) -> dict[str, str]:
    """Canonical weight name -> transformers parameter name."""
    candidates = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(num_layers):
        candidates += [
            f"model.layers.{i}.{s}"
            for s in (
                "input_layernorm.weight",
                "post_attention_layernorm.weight",
                "self_attn.q_proj.weight",
                "self_attn.k_proj.weight",
                "self_attn.v_proj.weight",
                "self_attn.q_proj.bias",
                "self_attn.k_proj.bias",
                "self_attn.v_proj.bias",
                "self_attn.o_proj.weight",
                "mlp.gate_proj.weight",
                "mlp.up_proj.weight",
                "mlp.down_proj.weight",
            )
        ]
    out = {}
    for hf in candidates:
        name = canonical_name(hf)
        if name is not None:
            out[name] = hf
    return out


def build_hf_model(model_dir: Path, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    params = dict(model.named_parameters())
    names = _hf_names(read_dummy_config(model_dir).num_layers)
    with torch.no_grad():
        for name, tensor in iter_dummy_weights(read_dummy_config(model_dir), dtype, device):
            params[names[name]].copy_(tensor)
            del tensor
    return model.eval()


def _generate(model: Any, ids: torch.Tensor, new_tokens: int) -> float:
    torch.cuda.synchronize(ids.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    torch.cuda.synchronize(ids.device)
    return time.perf_counter() - t0


def run_peer(
    model_dir: Path, dtype: torch.dtype, device: torch.device, workloads: list[Workload], repeats: int
) -> dict:
    """Median figures per workload, keyed like the offline report's."""
    model = build_hf_model(model_dir, dtype, device)
    report: dict = {"engine": "transformers", "version": __import__("transformers").__version__}
    for w in workloads:
        ids = torch.tensor(w.prompts, device=device)
        _generate(model, ids[:, :16], 2)  # warm-up of this batch size
        totals = [_generate(model, ids, w.max_tokens) for _ in range(repeats)]
        total = statistics.median(totals)
        out = w.max_tokens * len(w.prompts)
        row = {
            "output_tokens_per_s": out / total,
            "e2e_s": total,
            "total_tokens_per_s": (out + w.prompt_tokens) / total,
        }
        if len(w.prompts) == 1:
            ttft = statistics.median(_generate(model, ids, 1) for _ in range(repeats))
            row["ttft_s"] = ttft
            row["decode_tokens_per_s"] = (w.max_tokens - 1) / (total - ttft)
        report[w.name] = row
    del model
    torch.cuda.empty_cache()
    return report
