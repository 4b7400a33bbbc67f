"""Our GGML block dequantizer equals the gguf package's reference (gguf.quants) to the bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.ggml_raw import random_blocks
from traceless.model.layers.ggml_blocks import FORMATS, dequantize

ALL = sorted(FORMATS)


def _reference(raw: np.ndarray, fmt: str) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    return np.asarray(quants.dequantize(raw, GGMLQuantizationType[fmt]), dtype=np.float32)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("fmt", ALL)
def test_random_blocks_equal_the_reference_to_the_bit(fmt):
    rng = np.random.default_rng(0)
    f = FORMATS[fmt]
    raw = random_blocks(fmt, 4096, rng).reshape(64, -1)  # 64 rows
    cols = raw.shape[1] // f.type_size * f.block_size
    ours = dequantize(torch.from_numpy(raw), fmt, (64, cols)).numpy()
    assert _same_bits(ours, _reference(raw, fmt))


@pytest.mark.parametrize("fmt", ["Q4_0", "Q4_1", "Q8_0"])
def test_blocks_quantized_by_gguf_equal_the_reference(fmt):
    from gguf import GGMLQuantizationType, quants

    w = np.random.default_rng(1).standard_normal((48, 256)).astype(np.float32)
    raw = quants.quantize(w, GGMLQuantizationType[fmt])
    ours = dequantize(torch.from_numpy(raw), fmt, w.shape).numpy()
    assert _same_bits(ours, _reference(raw, fmt))
    assert np.abs(ours - w).max() < 0.5  # and they decode near the quantized values (|w| < 5)


def test_q4_k_known_block():
    """One hand-built Q4_K block: d = 0.5, dmin = 0.25, sub-block 0 scale 3 / min 2, sub-block 5
    scale 33 (its high bits in byte 1) / min 17 (high bits in byte 5); all nibbles 7 but byte 0's
    high nibble (value 32, sub-block 1) = 9."""
    blk = np.zeros(144, dtype=np.uint8)
    blk[0:2] = np.array([0.5], dtype=np.float16).view(np.uint8)
    blk[2:4] = np.array([0.25], dtype=np.float16).view(np.uint8)
    s = blk[4:16]
    s[0], s[4] = 3, 2  # scale 0 = 3, min 0 = 2
    s[1] |= (33 >> 4) << 6  # scale 5 high bits -> byte 1 top
    s[9] = (33 & 0xF) | ((17 & 0xF) << 4)  # scale 5 / min 5 low nibbles
    s[5] |= (17 >> 4) << 6  # min 5 high bits -> byte 5 top
    blk[16:] = 0x77
    blk[16] = 0x97
    out = dequantize(torch.from_numpy(blk), "Q4_K", (1, 256)).numpy()[0]
    assert out[0] == 0.5 * 3 * 7 - 0.25 * 2
    assert out[32] == 0.0 * 9 - 0.0  # sub-block 1: scale and min 0
    assert out[5 * 32 + 1] == 0.5 * 33 * 7 - 0.25 * 17
    assert _same_bits(out[None], _reference(blk[None], "Q4_K"))


def test_wrong_byte_count_is_refused():
    with pytest.raises(ValueError, match="do not hold"):
        dequantize(torch.zeros(143, dtype=torch.uint8), "Q4_K", (1, 256))
