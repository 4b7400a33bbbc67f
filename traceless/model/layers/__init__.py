"""The decoder's building blocks: paged attention, the fused element-wise ops, the paged KV cache
tensors, and the native CPU kernels (`csrc/kernels.c`, bound with ctypes in `kernels.py`)."""
