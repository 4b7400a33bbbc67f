"""How a model's weights are held: dense, quantized in memory for the CPU's int8 kernels, or FP8
for CUDA's FP8 matmuls.

The rule (also in --help and README):
    auto   a GGUF file on the CPU keeps its own blocks, unless --dtype was given explicitly (then
           it is dequantized to that dtype, as for exact parity runs) or the native kernels are
           missing; an FP8 checkpoint (its quantization_config) runs its FP8 matmuls on CUDA and
           is dequantized to --dtype on the CPU (runner/build.py); everything else is dense
    gguf   keep a GGUF file's blocks (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K; other types are
           dequantized to float32 at load)
    q8_0, q4_0
           quantize a Hugging Face checkpoint's matrices at load (llama.cpp's reference quantizers)
    fp8    (CUDA) a checkpoint's layer matrices quantized to FP8 at load, per output channel,
           activations quantized per token (model/fp8/); dummy weights too, which is how a 70B
           shape runs on one H200
    none   dense weights in --dtype (an FP8 checkpoint dequantized)
Quantized weights run on the CPU with float32 activations; combinations that contradict this
(a GPU, --dtype bfloat16, dummy weights, a GGUF file asked to be re-quantized) are refused, and so
is fp8 anywhere but CUDA and on a GGUF file. An FP8 checkpoint asked to be re-quantized to q8_0 or
q4_0 is refused by the loader, which reads its config.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from traceless.errors import ModelLoadError
from traceless.modes import DType, LoadFormat, QuantizationMode

if TYPE_CHECKING:
    import torch

    from traceless.model.layers.quant import QuantTensor


class Quantization(Enum):
    NONE = "none"
    GGUF = "gguf"  # the file's own blocks
    Q8_0 = "q8_0"  # quantized at load
    Q4_0 = "q4_0"
    FP8 = "fp8"  # FP8 matmuls on CUDA: the checkpoint's own, or quantized at load

    @property
    def cpu_blocks(self) -> bool:
        """GGML blocks for the CPU's int8 kernels (float32 activations)."""
        return self in (Quantization.GGUF, Quantization.Q8_0, Quantization.Q4_0)


def resolve_quantization(
    requested: QuantizationMode,
    dtype: DType,
    device_type: str,
    is_gguf: bool,
    load_format: LoadFormat,
    kernels_available: bool,
) -> Quantization:
    """The weight format for an engine; ValueError (with the reason) for combinations that make no sense."""
    if requested is QuantizationMode.NONE:
        return Quantization.NONE
    if requested is QuantizationMode.AUTO:
        keep = (
            is_gguf
            and device_type == "cpu"
            and dtype is DType.AUTO
            and load_format is LoadFormat.AUTO
            and kernels_available
        )
        return Quantization.GGUF if keep else Quantization.NONE
    if requested is QuantizationMode.FP8:
        return _fp8(device_type, is_gguf)
    word = requested.value
    if device_type != "cpu":
        raise ValueError(
            f"quantization={word} keeps weights quantized for the CPU kernels; on a GPU use quantization none (or auto)"
        )
    if load_format is not LoadFormat.AUTO:
        raise ValueError(f"quantization={word} needs real weights; load_format {load_format.value} makes dense ones")
    if dtype not in (DType.AUTO, DType.FLOAT32):
        raise ValueError(
            f"quantized weights run with float32 activations; dtype {dtype.value} contradicts "
            f"quantization={word} (use dtype auto or float32)"
        )
    if not kernels_available:
        raise ValueError(
            f"quantization={word} needs the native kernels, which are not built (pip install -e . with a C compiler)"
        )
    if requested is QuantizationMode.GGUF and not is_gguf:
        raise ValueError(
            "quantization=gguf keeps a GGUF file's blocks; this model is a Hugging Face "
            "checkpoint: use q8_0 or q4_0 to quantize it at load"
        )
    if requested is not QuantizationMode.GGUF and is_gguf:
        raise ValueError(
            f"the GGUF file is quantized already; quantization={word} would quantize it "
            "twice: use gguf (its own blocks) or none"
        )
    return Quantization(word)


def _fp8(device_type: str, is_gguf: bool) -> Quantization:
    if is_gguf:
        raise ValueError(
            "quantization=fp8 quantizes a Hugging Face checkpoint (or dummy weights); this model "
            "is a GGUF file: use gguf (its own blocks) or none"
        )
    if device_type != "cuda":
        # no FP8 arithmetic on the CPU: an emulated FP8 matmul widens every weight on each call,
        # slower than the dense model it would replace
        raise ValueError(
            "quantization=fp8 runs FP8 matmuls on CUDA only; on the CPU an FP8 checkpoint is "
            "dequantized at load (auto or none), and q8_0 or q4_0 quantize for the CPU's kernels"
        )
    return Quantization.FP8


def quantize_matrix(w: torch.Tensor, quantization: Quantization, what: str) -> QuantTensor:
    """A dense matrix [out, in] as q8_0/q4_0 blocks in the kernels' layout (`what` names it in the
    error for a row length the blocks do not divide)."""
    from traceless.model.layers.quant import QUANTIZERS, to_kernel_layout

    if w.dim() != 2 or w.shape[1] % 32:
        raise ModelLoadError(
            f"{what} has shape {tuple(w.shape)}; {quantization.value} needs rows of a multiple of 32 columns"
        )
    return to_kernel_layout(QUANTIZERS[quantization.value](w.contiguous()))
