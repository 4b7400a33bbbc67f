"""Packing a step's metadata into one buffer (the CUDA path's single host-to-device copy)."""

import numpy as np

from traceless.runner.batch import SeqInput
from traceless.runner.step_meta import Layout, fill


def test_fill_packs_every_part_and_pads():
    seqs = [SeqInput([7, 9, 4], 17, [11, 12, 13], 1), SeqInput([5], 2, [21], 1)]  # a chunk, a decode row
    layout = Layout(rows=6, logits=3, seqs=3, width=4)
    host = np.full(layout.size, 99, dtype=np.int32)
    end = fill(host, layout, seqs, block_size=8)
    v = {name: host[a:b] for name, (a, b) in layout.offsets.items()}
    assert v["ids"].tolist() == [11, 12, 13, 21, 0, 0]
    assert v["positions"].tolist() == [17, 18, 19, 2, 0, 0]
    assert v["blocks"].tolist() == [4, 4, 4, 5, -1, -1]  # positions 17-19 lie in table[17 // 8] = 4; padding -1
    assert v["offsets"].tolist() == [1, 2, 3, 2, 0, 0]
    assert v["logit_rows"].tolist() == [2, 3, 0]
    assert v["ctx"].tolist() == [20, 3, 0]
    assert v["cu_q"].tolist() == [0, 3, 4, 5]  # the padding sequence owns padding row 4
    assert v["tables"].reshape(3, 4)[:2].tolist() == [[7, 9, 4, 0], [5, 0, 0, 0]]
    assert end == layout.offsets["tables"][0] + 2 * 4
    assert layout.size == layout.offsets["tables"][1]
    assert all(a % 4 == 0 for a, _ in layout.offsets.values())  # every view 16-byte aligned
