"""The `quantization_config` of an FP8 checkpoint (config.json), parsed into one typed Fp8Config.

Two published forms are read, as vLLM reads them:

    {"quant_method": "fp8", "activation_scheme": "static" | "dynamic",
     "weight_block_size": [128, 128],                 # optional: block-wise weight scales
     "ignored_layers" | "modules_to_not_convert": [...], "fmt": "e4m3"}
        per tensor:  <module>.weight (float8_e4m3fn [N, K]), <module>.weight_scale (one float32),
                     <module>.input_scale (one float32, static activations only)
        block-wise:  <module>.weight, <module>.weight_scale_inv ([ceil(N / bn), ceil(K / bk)] float32,
                     multiplied in, despite its name), dynamic activations only

    {"quant_method": "compressed-tensors", "format": "float-quantized",
     "config_groups": {"group_0": {"targets": ["Linear"],
                                   "weights": {"type": "float", "num_bits": 8, "strategy": "tensor" | "channel", ...},
                                   "input_activations": {"type": "float", "num_bits": 8,
                                                         "dynamic": true, "strategy": "token"} |
                                                        {"dynamic": false, "strategy": "tensor", ...}}},
     "ignore": ["lm_head", "re:.*mlp.gate$"], ...}
        <module>.weight, <module>.weight_scale ([1] or [N, 1]), <module>.input_scale (static only)

Anything else (another quant_method, weight-only FP8, groups, asymmetric scales, KV-cache or output
quantization, sparsity, an unknown key) is refused with UnsupportedModelError naming the field.

The loader asks `config.quantizes(module)` for each Linear (Hugging Face module names such as
`model.layers.0.self_attn.q_proj`) and reads `config.weight_scale_name` beside its weight.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from traceless.errors import UnsupportedModelError


class Fp8Method(Enum):
    FP8 = "fp8"
    COMPRESSED_TENSORS = "compressed-tensors"


class WeightScales(Enum):
    TENSOR = "tensor"  # one scale per weight matrix
    CHANNEL = "channel"  # one per output row: [N]
    BLOCK = "block"  # one per (bn x bk) tile: [ceil(N / bn), ceil(K / bk)]


class ActivationScheme(Enum):
    STATIC = "static"  # one calibrated per-tensor scale per Linear (<module>.input_scale)
    DYNAMIC = "dynamic"  # computed at run time, one scale per token


@dataclass(frozen=True, slots=True)
class Fp8Config:
    method: Fp8Method
    weight_scales: WeightScales
    activations: ActivationScheme
    block: tuple[int, int] | None = None  # (bn, bk) when weight_scales is BLOCK
    ignore: tuple[str, ...] = ()  # modules kept unquantized: names, or "re:" + a regular expression

    @property
    def weight_scale_name(self) -> str:
        """The tensor beside <module>.weight that holds its scales."""
        return "weight_scale_inv" if self.weight_scales is WeightScales.BLOCK else "weight_scale"

    def quantizes(self, module: str) -> bool:
        """Whether the Linear named `module` is stored in FP8 (not in the ignore list). A plain entry
        matches the module or a module path ending in it (`lm_head` matches `lm_head`)."""
        for entry in self.ignore:
            if entry.startswith("re:"):
                if re.match(entry[3:], module):
                    return False
            elif module == entry or module.endswith("." + entry):
                return False
        return True


def parse_fp8_config(raw: dict[str, Any]) -> Fp8Config:
    """quantization_config (a dict from config.json) -> Fp8Config, or UnsupportedModelError."""
    method = raw.get("quant_method")
    if method == Fp8Method.FP8.value:
        return _parse_fp8(raw)
    if method == Fp8Method.COMPRESSED_TENSORS.value:
        return _parse_compressed_tensors(raw)
    raise UnsupportedModelError(
        f"quantization_config.quant_method {method!r} is not supported (fp8, compressed-tensors)"
    )


def _refuse(field: str, value: object, allowed: str) -> UnsupportedModelError:
    return UnsupportedModelError(f"quantization_config.{field} {value!r} is not supported ({allowed})")


def _check_keys(raw: dict[str, Any], where: str, known: set[str]) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UnsupportedModelError(f"quantization_config{where} has unsupported key(s): {', '.join(unknown)}")


# Keys transformers writes when it saves a fine-grained FP8 model, accepted at their default only.
_FP8_DEFAULTS = {"dequantize": False, "scale_fmt": "float", "expert_dtype": "fp8", "modules_to_convert": None}


def _parse_fp8(raw: dict[str, Any]) -> Fp8Config:
    _check_keys(
        raw,
        "",
        {
            "quant_method",
            "activation_scheme",
            "weight_block_size",
            "ignored_layers",
            "modules_to_not_convert",
            "fmt",
            *_FP8_DEFAULTS,
        },
    )
    for key, default in _FP8_DEFAULTS.items():
        if key in raw and raw[key] != default:
            raise _refuse(key, raw[key], f"{default!r} only")
    if raw.get("fmt", "e4m3") != "e4m3":
        raise _refuse("fmt", raw["fmt"], "e4m3")
    scheme = raw.get("activation_scheme")
    if scheme not in ("static", "dynamic"):
        raise _refuse("activation_scheme", scheme, "static, dynamic")
    activations = ActivationScheme(scheme)
    block = raw.get("weight_block_size")
    if block is not None:
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
            raise _refuse("weight_block_size", block, "two positive integers")
        if activations is not ActivationScheme.DYNAMIC:
            raise _refuse("activation_scheme", scheme, "dynamic only with weight_block_size")
    ignore = _string_list(raw, "ignored_layers") + _string_list(raw, "modules_to_not_convert")
    return Fp8Config(
        method=Fp8Method.FP8,
        weight_scales=WeightScales.BLOCK if block else WeightScales.TENSOR,
        activations=activations,
        block=(block[0], block[1]) if block else None,
        ignore=ignore,
    )


def _string_list(raw: dict[str, Any], key: str) -> tuple[str, ...]:
    value = raw.get(key)
    if value is None:
        return ()
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise _refuse(key, value, "a list of module names")
    return tuple(value)


_CT_KEYS = {
    "quant_method",
    "format",
    "config_groups",
    "ignore",
    "kv_cache_scheme",
    "quantization_status",
    "global_compression_ratio",
    "sparsity_config",
    "transform_config",
    "version",
}
_ARGS_KEYS = {
    "num_bits",
    "type",
    "symmetric",
    "group_size",
    "strategy",
    "block_structure",
    "dynamic",
    "actorder",
    "observer",
    "observer_kwargs",
}


def _parse_compressed_tensors(raw: dict[str, Any]) -> Fp8Config:
    _check_keys(raw, "", _CT_KEYS)
    if raw.get("format") not in ("float-quantized", "naive-quantized"):
        raise _refuse("format", raw.get("format"), "float-quantized, naive-quantized")
    if raw.get("quantization_status", "compressed") not in ("compressed", "frozen"):
        raise _refuse("quantization_status", raw["quantization_status"], "compressed, frozen")
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if raw.get(key):
            raise _refuse(key, "set", "null only")
    groups = raw.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _refuse("config_groups", groups, "one or more groups")
    parsed = {_parse_group(name, group) for name, group in groups.items()}
    if len(parsed) != 1:
        raise UnsupportedModelError("quantization_config.config_groups differ from one another (one scheme only)")
    weight_scales, activations = parsed.pop()
    return Fp8Config(
        method=Fp8Method.COMPRESSED_TENSORS,
        weight_scales=weight_scales,
        activations=activations,
        ignore=_string_list(raw, "ignore"),
    )


def _parse_group(name: str, group: Any) -> tuple[WeightScales, ActivationScheme]:
    where = f"config_groups.{name}"
    if not isinstance(group, dict):
        raise _refuse(where, group, "an object")
    _check_keys(group, "." + where, {"targets", "weights", "input_activations", "output_activations", "format"})
    if group.get("targets") != ["Linear"]:
        raise _refuse(where + ".targets", group.get("targets"), "['Linear']")
    if group.get("output_activations") is not None:
        raise _refuse(where + ".output_activations", "set", "null only")
    if group.get("format") not in (None, "float-quantized", "naive-quantized"):
        raise _refuse(where + ".format", group["format"], "float-quantized, naive-quantized")
    weights = _float8_args(group.get("weights"), where + ".weights")
    if weights["dynamic"]:
        raise _refuse(where + ".weights.dynamic", True, "false")
    if weights["strategy"] not in ("tensor", "channel"):
        raise _refuse(where + ".weights.strategy", weights["strategy"], "tensor, channel")
    acts = group.get("input_activations")
    if acts is None:
        raise _refuse(where + ".input_activations", None, "float8 activations (weight-only FP8 is not served)")
    acts = _float8_args(acts, where + ".input_activations")
    want = "token" if acts["dynamic"] else "tensor"
    if acts["strategy"] != want:
        raise _refuse(where + ".input_activations.strategy", acts["strategy"], "token when dynamic, tensor when static")
    scheme = ActivationScheme.DYNAMIC if acts["dynamic"] else ActivationScheme.STATIC
    return WeightScales(weights["strategy"]), scheme


def _float8_args(args: Any, where: str) -> dict[str, Any]:
    """One QuantizationArgs object: 8-bit symmetric float, no groups, blocks or activation order."""
    if not isinstance(args, dict):
        raise _refuse(where, args, "an object")
    _check_keys(args, "." + where, _ARGS_KEYS)
    if args.get("type") != "float" or args.get("num_bits") != 8:
        raise _refuse(where + ".type", f"{args.get('type')}/{args.get('num_bits')} bits", "float/8 bits")
    if args.get("symmetric", True) is not True:
        raise _refuse(where + ".symmetric", args["symmetric"], "true")
    for key in ("group_size", "block_structure", "actorder"):
        if args.get(key) is not None:
            raise _refuse(f"{where}.{key}", args[key], "null")
    if not isinstance(args.get("dynamic", False), bool):
        raise _refuse(where + ".dynamic", args.get("dynamic"), "true, false")
    return {"dynamic": args.get("dynamic", False), "strategy": args.get("strategy")}
