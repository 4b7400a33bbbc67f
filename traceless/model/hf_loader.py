"""Load a Hugging Face model directory: config.json, *.safetensors (one file, or the shards that
model.safetensors.index.json lists), tokenizer files.

The weights come back as a LazyWeights (model/lazy_weights.py): each tensor is read from the
memory-mapped files when the decoder takes it, under its canonical name (`layers.{i}.q`, ...).
A mixture-of-experts layer's router and experts are read together and handed out stacked
(`layers.{i}.router`, `layers.{i}.experts.gate_up` [E, 2I, H], `layers.{i}.experts.down` [E, H, I]:
model/moe_checkpoint.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import torch

from traceless.errors import ModelLoadError, UnsupportedModelError
from traceless.model.config import ModelConfig
from traceless.model.fp8.checkpoint import Fp8Weight, dequantizing_take, read_fp8_weight
from traceless.model.fp8.config import Fp8Config
from traceless.model.hf_config import from_hf_config
from traceless.model.lazy_weights import LazyWeights, Read, SafetensorsFiles
from traceless.model.moe_checkpoint import MOE_FIELDS, MoESpec, Take, read_moe_weights

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.q_proj.bias": "q_bias",
    "self_attn.k_proj.bias": "k_bias",
    "self_attn.v_proj.bias": "v_bias",
    "self_attn.qkv_proj.weight": "qkv",  # Phi-3: fused, rows [q | k | v]
    "self_attn.q_norm.weight": "q_norm",
    "self_attn.k_norm.weight": "k_norm",
    "self_attn.o_proj.weight": "o",
    "self_attn.o_proj.bias": "o_bias",  # gpt-oss: biased
    "self_attn.sinks": "sinks",  # gpt-oss: a logit per head in each softmax
    "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "down",
    "mlp.gate_up_proj.weight": "gate_up",  # Phi-3: fused, rows [gate | up]
}
# Gemma 2/3 name their norms after where they sit: post_attention_layernorm is on the attention's
# output there, where Llama's (same name) is the MLP's input norm.
_GEMMA_LAYER_NAMES = _LAYER_NAMES | {
    "post_attention_layernorm.weight": "post_attn_norm",
    "pre_feedforward_layernorm.weight": "mlp_norm",
    "post_feedforward_layernorm.weight": "post_mlp_norm",
}
_LINEARS = ("q", "k", "v", "qkv", "o", "gate", "up", "gate_up", "down")
# an FP8 checkpoint's scales beside <module>.weight
_FP8_SCALES = (".weight_scale", ".weight_scale_inv", ".input_scale")
_GLOBAL_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}
# Buffers some checkpoints carry that are recomputed, not loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Gemma3ForConditionalGeneration: the text model's tensors under these prefixes (transformers >= 4.52
# and older checkpoints); the vision tower and projector are not part of a text model.
_TEXT_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path.name} ({type(exc).__name__})") from None


def canonical_name(hf_name: str, architecture: str = "llama") -> str | None:
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    names = _GEMMA_LAYER_NAMES if architecture in ("gemma2", "gemma3") else _LAYER_NAMES
    m = _LAYER.match(hf_name)
    if m and m.group(2) in names:
        return f"layers.{m.group(1)}.{names[m.group(2)]}"
    return None


def _text_name(hf_name: str, multimodal: bool) -> str | None:
    """The tensor's name in a text-only checkpoint; None for a vision tensor to skip."""
    if not multimodal:
        return hf_name
    if hf_name.startswith(_VISION_PREFIXES):
        return None
    for prefix, replacement in _TEXT_PREFIXES:
        if hf_name.startswith(prefix):
            return replacement + hf_name[len(prefix) :]
    return hf_name


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a directory: the shards model.safetensors.index.json names (each
    must exist), else every *.safetensors file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError("model.safetensors.index.json has no weight_map")
        names = sorted({str(f) for f in weight_map.values()})
        files = [path / n for n in names]
        missing = [n for n, f in zip(names, files) if "/" in n or not f.is_file()]
        if missing:
            raise ModelLoadError(
                f"{len(missing)} shard(s) named by model.safetensors.index.json are missing, e.g. {missing[0]}"
            )
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors weight files")
    return files


def load_hf_dir(path: Path, dtype: torch.dtype, keep_fp8: bool = False) -> tuple[ModelConfig, LazyWeights]:
    """The config and the weights, to be read one tensor at a time as the model takes them.
    An FP8 checkpoint's weights are dequantized to dtype, or with keep_fp8 (the GPU path) its
    FP8 Linears are kept FP8 for Fp8Linear (LazyWeights.take_fp8)."""
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"{path} has no config.json")
    raw = read_json(config_path)
    config = from_hf_config(raw)
    multimodal = "Gemma3ForConditionalGeneration" in (raw.get("architectures") or [])

    def rename(key: str) -> str | None:
        return None if key.endswith(_IGNORED_SUFFIXES) else _text_name(key, multimodal)

    files = SafetensorsFiles(weight_files(path), rename)
    return config, _lazy_weights(files, config, dtype, keep_fp8)


def _lazy_weights(files: SafetensorsFiles, config: ModelConfig, dtype: torch.dtype, keep_fp8: bool) -> LazyWeights:
    """Every checkpoint tensor under its canonical name, read when taken; a sparse layer's router
    and experts as that layer's stacked MoE tensors; FP8 weights dequantized or kept."""
    weights = LazyWeights(files)
    fp8 = config.fp8
    take = files.take if fp8 is None else dequantizing_take(files.take, fp8, dtype)
    sparse: set[int] = set()
    for name in files.names():
        m = _LAYER.match(name)
        if (
            m
            and config.moe is not None
            and config.sparse(int(m.group(1)))
            and m.group(2).startswith(config.moe.checkpoint_prefix)
        ):
            sparse.add(int(m.group(1)))  # read by the layer's MoE reader
            continue
        if fp8 is not None and name.endswith(_FP8_SCALES):
            continue  # read with its weight
        canonical = canonical_name(name, config.architecture)
        if canonical is None:
            raise UnsupportedModelError(f"unexpected tensor {name!r} in the checkpoint")
        if fp8 is not None and keep_fp8 and _is_linear(canonical) and files.stored_dtype(name) == "F8_E4M3":
            weights.add_fp8(canonical, _fp8_reader(files.take, name.removesuffix(".weight"), fp8))
        else:
            weights.add(canonical, _reader(take, name, dtype))
    if config.moe is not None:
        for i in sorted(sparse):
            reader = _MoELayerReader(take, f"model.layers.{i}.", config.moe, dtype)
            for field in config.moe.weight_shapes():
                weights.add(f"layers.{i}.{field}", reader.field(field))
    return weights


def _reader(take: Take, name: str, dtype: torch.dtype) -> Read:
    def read() -> torch.Tensor:
        t = take(name)
        if t is None:
            raise ModelLoadError(f"tensor {name!r} was read twice")
        return t.to(dtype)

    return read


def _is_linear(canonical: str) -> bool:
    """The decoder's matrices that may run as Fp8Linear: a layer's projections (not the
    embedding, the output head, norms or routers)."""
    return canonical.rsplit(".", 1)[-1] in _LINEARS and canonical.startswith("layers.")


def _fp8_reader(take: Take, module: str, fp8: Fp8Config) -> Callable[[], Fp8Weight]:
    return lambda: read_fp8_weight(take, module, fp8)


class _MoELayerReader:
    """One sparse layer's router and experts, read together on the first take (the checkpoint
    stores experts one by one; the decoder takes them stacked) and handed out field by field."""

    def __init__(self, take: Take, prefix: str, spec: MoESpec, dtype: torch.dtype):
        self.take, self.prefix, self.spec, self.dtype = take, prefix, spec, dtype
        self.fields: dict[str, torch.Tensor] | None = None

    def field(self, name: str) -> Read:
        def read() -> torch.Tensor:
            if self.fields is None:
                w = read_moe_weights(self.take, self.prefix, self.spec, self.dtype)
                self.fields = {f: getattr(w, attr) for f, attr in MOE_FIELDS.items() if getattr(w, attr) is not None}
            return self.fields.pop(name)

        return read
