"""Step metadata for the CUDA path, packed into one pinned host buffer and sent in ONE
host-to-device copy (many small torch.tensor(..., device=cuda) calls cost a launch and a
synchronizing copy each).

One int32 buffer holds, one after the other (B sequences, T rows, W block-table columns):

    ids [T] | positions [T] | slot blocks [T] | slot offsets [T] | logit rows [R]
    | context lens [B] | cu_q [B + 1] | block tables [B, W]

Padding rows (a captured batch of more rows than sequences) get slot block -1: the cache write
skips them; each padding sequence owns one padding row (while rows last) and has no keys, so the
attention kernel writes zeros there.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from traceless.runner.batch import SeqInput


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each part sits in the packed buffer, for up to `rows` rows, `logits` logit rows,
    `seqs` sequences and `width` block-table columns."""

    rows: int
    logits: int
    seqs: int
    width: int

    @property
    def offsets(self) -> dict[str, tuple[int, int]]:
        parts = (("ids", self.rows), ("positions", self.rows), ("blocks", self.rows), ("offsets", self.rows),
                 ("logit_rows", self.logits), ("ctx", self.seqs), ("cu_q", self.seqs + 1),
                 ("tables", self.seqs * self.width))
        out, at = {}, 0
        for name, n in parts:
            out[name] = (at, at + n)
            at += n
        return out

    @property
    def size(self) -> int:
        return 4 * self.rows + self.logits + 2 * self.seqs + 1 + self.seqs * self.width

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views into a packed buffer (host or device); tables as [seqs, width]."""
        v = {name: buf[a:b] for name, (a, b) in self.offsets.items()}
        v["tables"] = v["tables"].view(self.seqs, self.width)
        return v


def fill(host: np.ndarray, layout: Layout, seqs: Sequence[SeqInput], block_size: int) -> int:
    """Write the metadata of `seqs` (packed in the given order) into `host` (an int32 array over the
    pinned buffer, at least layout.size long). Returns the number of leading elements to copy:
    everything up to the last real block-table row."""
    off = layout.offsets
    ids: list[int] = []
    positions: list[int] = []
    blocks: list[int] = []
    offsets: list[int] = []
    logit_rows: list[int] = []
    ctx: list[int] = []
    cu = [0]
    for s in seqs:
        ids.extend(s.token_ids)
        logit_rows.extend(range(len(ids) - s.num_logits, len(ids)))
        pos = range(s.start, s.start + len(s.token_ids))
        positions.extend(p + s.rope_shift for p in pos)
        blocks.extend(s.table[p // block_size] for p in pos)
        offsets.extend(p % block_size for p in pos)
        ctx.append(s.start + len(s.token_ids))
        cu.append(len(ids))
    n = len(ids)
    for name, values, pad in (("ids", ids, 0), ("positions", positions, 0), ("blocks", blocks, -1),
                              ("offsets", offsets, 0), ("logit_rows", logit_rows, 0), ("ctx", ctx, 0)):
        a, b = off[name]
        host[a : a + len(values)] = values
        host[a + len(values) : b] = pad
    a, b = off["cu_q"]
    host[a : a + len(cu)] = cu
    # padding sequences (a captured batch): one padding row each while rows last, no keys
    host[a + len(cu) : b] = np.minimum(n + np.arange(1, b - a - len(cu) + 1), layout.rows)
    a, _ = off["tables"]
    w = layout.width
    for i, s in enumerate(seqs):
        need = -(-(s.start + len(s.token_ids)) // block_size)
        row = host[a + i * w : a + (i + 1) * w]
        row[:need] = s.table[:need]
        row[need:] = 0
    return a + len(seqs) * w


class PinnedStaging:
    """A reusable pinned host buffer for one copy per step. Before it is overwritten, the copy that
    last read it must be done: an event recorded after that copy is waited on (a step that samples
    nothing has no other synchronization point)."""

    def __init__(self) -> None:
        self._host = torch.empty(0, dtype=torch.int32)
        self._copied: torch.cuda.Event | None = None
        self._uploads: list[torch.Tensor] = []  # this step's device copies, zeroed by scrub()

    def upload(self, layout: Layout, seqs: Sequence[SeqInput], block_size: int, device: torch.device) -> torch.Tensor:
        """Pack `seqs` and copy the buffer to a new device tensor of layout.size int32."""
        if self._copied is not None:
            self._copied.synchronize()
        if self._host.numel() < layout.size:
            self._host = torch.zeros(max(layout.size, 2 * self._host.numel()), dtype=torch.int32, pin_memory=True)
        fill(self._host.numpy(), layout, seqs, block_size)
        dev = self._host[: layout.size].to(device, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        self._uploads.append(dev)
        return dev

    def scrub(self) -> None:
        """Overwrite the token ids and positions the buffer still holds (after the step)."""
        if self._copied is not None:
            self._copied.synchronize()
        with torch.inference_mode():  # the buffers are inference tensors
            self._host.zero_()
            for dev in self._uploads:
                dev.zero_()  # before the caching allocator hands the memory to anyone else
        self._uploads.clear()
