"""Tiny FP8 checkpoints written from a tiny unquantized one, in the published forms, beside the
reference dequantization of the same bytes (an unquantized checkpoint that transformers runs):
the FP8 loader's tests compare against it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from tests.support.fp8 import decode_e4m3

FP8 = torch.float8_e4m3fn
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")
BLOCK = (32, 32)
STATIC_INPUT_SCALE = 16.0 / 448  # activations up to 16 in magnitude are represented

FORMS = {
    "fp8-static": {"quant_method": "fp8", "activation_scheme": "static"},
    "fp8-dynamic": {"quant_method": "fp8", "activation_scheme": "dynamic"},
    "fp8-block": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": list(BLOCK)},
    "ct-channel": {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "symmetric": True, "strategy": "channel", "dynamic": False},
                "input_activations": {
                    "type": "float",
                    "num_bits": 8,
                    "symmetric": True,
                    "strategy": "token",
                    "dynamic": True,
                },
            }
        },
    },
    "ct-tensor-static": {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "symmetric": True, "strategy": "tensor", "dynamic": False},
                "input_activations": {
                    "type": "float",
                    "num_bits": 8,
                    "symmetric": True,
                    "strategy": "tensor",
                    "dynamic": False,
                },
            }
        },
    },
}
_STATIC = ("fp8-static", "ct-tensor-static")  # forms with a calibrated input_scale per Linear


def _quantized_module(name: str, ignore: tuple[str, ...]) -> bool:
    module = name.removesuffix(".weight")
    return (
        name.endswith(".weight")
        and module.rsplit(".", 1)[-1] in _PROJECTIONS
        and not any(module.endswith(i) for i in ignore)
    )


def _quantize(w: torch.Tensor, form: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], the scale tensor as stored, the reference dequantization [N, K])."""
    w = w.float()
    if form == "fp8-block":
        bn, bk = BLOCK
        rows, cols = -(-w.shape[0] // bn), -(-w.shape[1] // bk)
        scale = torch.empty(rows, cols)
        for i in range(rows):
            for j in range(cols):
                scale[i, j] = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk].abs().max() / 448
        full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[: w.shape[0], : w.shape[1]]
    elif form == "ct-channel":
        scale = w.abs().amax(dim=1, keepdim=True) / 448  # [N, 1]
        full = scale.expand_as(w)
    else:
        scale = w.abs().max() / 448  # one value
        full = scale.expand_as(w)
    q = (w / full).clamp(-448, 448).to(FP8)
    return q, scale, (decode_e4m3(q) * full.double()).float()


def write_fp8_checkpoint(src: Path, dst: Path, form: str, ignore: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """src: an unquantized tiny model directory. Writes dst / "fp8" (its layer projections in FP8
    of `form`, the modules ending in an `ignore` entry left unquantized and named in the config's
    ignore list) and dst / "reference" (the same model with those weights dequantized by
    tests/support/fp8.py's bit-level decoding). Returns (fp8 dir, reference dir)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    fp8, ref = {}, {}
    for name, w in tensors.items():
        if not _quantized_module(name, ignore):
            fp8[name], ref[name] = w, w
            continue
        module = name.removesuffix(".weight")
        q, scale, deq = _quantize(w, form)
        fp8[name], ref[name] = q, deq.to(w.dtype)
        fp8[module + (".weight_scale_inv" if form == "fp8-block" else ".weight_scale")] = scale.float().reshape(
            scale.shape if scale.dim() else ()
        )
        if form in _STATIC:
            fp8[module + ".input_scale"] = torch.tensor(STATIC_INPUT_SCALE)
    config = json.loads((src / "config.json").read_text())
    quant = dict(FORMS[form])
    if ignore:
        quant["ignore" if form.startswith("ct") else "ignored_layers"] = list(ignore)
    out = {}
    for kind, weights, cfg in (("fp8", fp8, config | {"quantization_config": quant}), ("reference", ref, config)):
        d = dst / kind
        d.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.name not in ("model.safetensors", "config.json"):
                shutil.copy(f, d / f.name)
        save_file({k: v.contiguous() for k, v in weights.items()}, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(cfg))
        out[kind] = d
    return out["fp8"], out["reference"]
