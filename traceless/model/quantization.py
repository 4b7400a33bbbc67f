"""How a model's weights are held: dense, or quantized in memory for the CPU's int8 kernels.

The rule (also in --help and README):
    auto   a GGUF file on the CPU keeps its own blocks, unless --dtype was given explicitly (then
           it is dequantized to that dtype, as for exact parity runs) or the native kernels are
           missing; everything else is dense
    gguf   keep a GGUF file's blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K; other types are
           dequantized to float32 at load)
    q8_0, q4_0
           quantize a Hugging Face checkpoint's matrices at load (llama.cpp's reference quantizers)
    none   dense weights in --dtype
Quantized weights run on the CPU with float32 activations; combinations that contradict this
(a GPU, --dtype bfloat16, dummy weights, a GGUF file asked to be re-quantized) are refused.
"""
from __future__ import annotations

from enum import Enum


class Quantization(Enum):
    NONE = "none"
    GGUF = "gguf"  # the file's own blocks
    Q8_0 = "q8_0"  # quantized at load
    Q4_0 = "q4_0"


def resolve_quantization(requested: str, dtype: str, device_type: str, is_gguf: bool, load_format: str,
                         kernels_available: bool) -> Quantization:
    """The weight format for an engine; ValueError (with the reason) for combinations that make no sense."""
    if requested == "none":
        return Quantization.NONE
    if requested == "auto":
        keep = is_gguf and device_type == "cpu" and dtype == "auto" and load_format == "auto" and kernels_available
        return Quantization.GGUF if keep else Quantization.NONE
    if device_type != "cpu":
        raise ValueError(f"quantization={requested} keeps weights quantized for the CPU kernels; "
                         "on a GPU use quantization none (or auto)")
    if load_format != "auto":
        raise ValueError(f"quantization={requested} needs real weights; load_format {load_format} makes dense ones")
    if dtype not in ("auto", "float32"):
        raise ValueError(f"quantized weights run with float32 activations; dtype {dtype} contradicts "
                         f"quantization={requested} (use dtype auto or float32)")
    if not kernels_available:
        raise ValueError(f"quantization={requested} needs the native kernels, which are not built "
                         "(pip install -e . with a C compiler)")
    if requested == "gguf" and not is_gguf:
        raise ValueError("quantization=gguf keeps a GGUF file's blocks; this model is a Hugging Face "
                         "checkpoint: use q8_0 or q4_0 to quantize it at load")
    if requested in ("q8_0", "q4_0") and is_gguf:
        raise ValueError(f"the GGUF file is quantized already; quantization={requested} would quantize it "
                         "twice: use gguf (its own blocks) or none")
    return Quantization(requested)
