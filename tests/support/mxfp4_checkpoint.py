"""A gpt-oss checkpoint with its experts in MXFP4, written from a tiny unquantized one, beside the
reference: the same model with the experts replaced by their MXFP4 values (which transformers
runs without any quantization support)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

_FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # e2m1 magnitudes, codes 0..7
_EXPERTS = ("gate_up_proj", "down_proj")


def encode_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [E, R, C] (rows = output features, C a multiple of 32) -> (blocks [E, R, C/32, 16] uint8,
    scales [E, R, C/32] uint8, the values they hold [E, R, C] float32). Each block of 32 shares
    the power of two that brings its largest magnitude to at most 6; values round to the nearest
    e2m1 magnitude (ties to the lower code)."""
    E, R, C = w.shape
    g = w.float().reshape(E, R, C // 32, 32)
    amax = g.abs().amax(-1).clamp(min=2.0**-100)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = g / torch.exp2(exp)[..., None]
    codes = (scaled.abs()[..., None] - _FP4).abs().argmin(-1)  # [E, R, G, 32] in 0..7
    codes = codes | ((scaled < 0) & (codes > 0)).long() << 3
    values = _FP4[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    pairs = codes.view(E, R, C // 32, 16, 2)
    blocks = (pairs[..., 0] | pairs[..., 1] << 4).to(torch.uint8)  # low nibble first
    scales = (exp + 127).to(torch.uint8)
    deq = torch.ldexp(values, exp.int()[..., None]).view(E, R, C)
    return blocks, scales, deq


def write_mxfp4_checkpoint(src: Path, dst: Path) -> tuple[Path, Path]:
    """Returns (MXFP4 dir, reference dir). The checkpoint's experts are [E, in, out] (x @ W); the
    MXFP4 tensors hold them with rows = output features, as gpt-oss publishes them."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    quant, ref = {}, {}
    for name, w in tensors.items():
        if name.rsplit(".", 1)[-1] not in _EXPERTS:
            quant[name], ref[name] = w, w
            continue
        blocks, scales, deq = encode_mxfp4(w.transpose(1, 2))
        quant[name + "_blocks"], quant[name + "_scales"] = blocks, scales
        ref[name] = deq.transpose(1, 2).to(w.dtype).contiguous()
    config = json.loads((src / "config.json").read_text())
    out = {}
    for kind, weights, cfg in (
        ("mxfp4", quant, config | {"quantization_config": {"quant_method": "mxfp4"}}),
        ("reference", ref, config),
    ):
        d = dst / kind
        d.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.name not in ("model.safetensors", "config.json"):
                shutil.copy(f, d / f.name)
        save_file(weights, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(cfg))
        out[kind] = d
    return out["mxfp4"], out["reference"]
