"""Raw GGML blocks for tests: random bytes with finite float16 scale fields (every bit pattern of the
quant fields occurs), and GGUF-ready raw tensors of any block format."""

from __future__ import annotations

import numpy as np

from traceless.model.layers.ggml_blocks import FORMATS

# byte offsets of each format's float16 fields inside one block
F16_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


def random_blocks(fmt: str, n_blocks: int, rng: np.random.Generator, scale: float = 0.01) -> np.ndarray:
    """[n_blocks, type_size] uint8: uniform random bytes, float16 fields drawn from N(0, scale)."""
    f = FORMATS[fmt]
    blocks = rng.integers(0, 256, size=(n_blocks, f.type_size), dtype=np.uint8)
    for off in F16_FIELDS[fmt]:
        vals = (rng.standard_normal(n_blocks) * scale).astype(np.float16)
        blocks[:, off : off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def random_tensor(fmt: str, rows: int, cols: int, rng: np.random.Generator, scale: float = 0.01) -> np.ndarray:
    """Raw bytes of a [rows, cols] tensor: [rows, cols / block_size * type_size] uint8."""
    f = FORMATS[fmt]
    blocks = random_blocks(fmt, rows * cols // f.block_size, rng, scale)
    return blocks.reshape(rows, cols // f.block_size * f.type_size)
