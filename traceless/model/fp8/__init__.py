"""FP8 checkpoints and FP8 matmuls: `config.py` parses a checkpoint's quantization_config,
`convert.py` dequantizes (CPU) and quantizes (load and run time), `checkpoint.py` reads a
checkpoint's FP8 tensors for either path, `linear.py` is the GPU's FP8 Linear (torch._scaled_mm)."""
