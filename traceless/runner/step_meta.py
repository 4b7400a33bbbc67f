"""Step metadata for the CUDA path, packed into one pinned host buffer and sent in ONE
host-to-device copy (many small torch.tensor(..., device=cuda) calls cost a launch and a
synchronizing copy each).

One int32 buffer holds, one after the other (B sequences, T rows, W block-table columns):

    ids [T] | positions [T] | slot blocks [T] | slot offsets [T] | logit rows [R]
    | context lens [B] | cu_q [B + 1] | block tables [B, W]
    | (KV groups 1..: model/kv_groups.py) slot blocks [T] | block tables [B, W]   per group

each part starting on a 16-byte boundary (the gaps hold zeros).

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


ALIGN = 4  # int32 elements: 16 bytes


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each part sits in the packed buffer, for up to `rows` rows, `logits` logit rows,
    `seqs` sequences and `width` block-table columns."""

    rows: int
    logits: int
    seqs: int
    width: int
    groups: int = 1  # KV groups: groups 1.. have their own slot blocks and block tables

    @property
    def offsets(self) -> dict[str, tuple[int, int]]:
        """Each part starts at a multiple of ALIGN elements: a view's address is then 16-byte
        aligned whatever the batch, and Triton, which specializes a kernel on its pointers'
        alignment, compiles one variant, not one per batch composition."""
        parts: tuple[tuple[str, int], ...] = (
            ("ids", self.rows),
            ("positions", self.rows),
            ("blocks", self.rows),
            ("offsets", self.rows),
            ("logit_rows", self.logits),
            ("ctx", self.seqs),
            ("cu_q", self.seqs + 1),
            ("tables", self.seqs * self.width),
        )
        for g in range(1, self.groups):
            parts += ((f"blocks{g}", self.rows), (f"tables{g}", self.seqs * self.width))
        out, at = {}, 0
        for name, n in parts:
            out[name] = (at, at + n)
            at += -(-n // ALIGN) * ALIGN
        return out

    @property
    def size(self) -> int:
        return self.offsets[_tables(self.groups - 1)][1]

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views into a packed buffer (host or device); tables as [seqs, width]."""
        v = {name: buf[a:b] for name, (a, b) in self.offsets.items()}
        for g in range(self.groups):
            v[_tables(g)] = v[_tables(g)].view(self.seqs, self.width)
        return v


def _tables(group: int) -> str:
    return "tables" if group == 0 else f"tables{group}"


def _blocks(group: int) -> str:
    return "blocks" if group == 0 else f"blocks{group}"


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
        blocks.extend(s.table[p // block_size] for p in pos)  # (groups 1..: _fill_group)
        offsets.extend(p % block_size for p in pos)
        ctx.append(s.start + len(s.token_ids))
        cu.append(len(ids))
    n = len(ids)
    for name, values, pad in (
        ("ids", ids, 0),
        ("positions", positions, 0),
        ("blocks", blocks, -1),
        ("offsets", offsets, 0),
        ("logit_rows", logit_rows, 0),
        ("ctx", ctx, 0),
    ):
        a, b = off[name]
        host[a : a + len(values)] = values
        host[a + len(values) : b] = pad
    a, b = off["cu_q"]
    host[a : a + len(cu)] = cu
    # padding sequences (a captured batch): one padding row each while rows last, no keys
    host[a + len(cu) : b] = np.minimum(n + np.arange(1, b - a - len(cu) + 1), layout.rows)
    _fill_tables(host, layout, 0, [s.table for s in seqs], seqs, block_size)
    for g in range(1, layout.groups):
        tables = [s.group_tables[g - 1] for s in seqs]
        a, b = off[_blocks(g)]
        ids = [t[p // block_size] for s, t in zip(seqs, tables) for p in range(s.start, s.start + len(s.token_ids))]
        host[a : a + len(ids)] = ids
        host[a + len(ids) : b] = -1
        _fill_tables(host, layout, g, tables, seqs, block_size)
    return off[_tables(layout.groups - 1)][0] + len(seqs) * layout.width


def _fill_tables(
    host: np.ndarray, layout: Layout, group: int, tables: Sequence[list[int]], seqs: Sequence[SeqInput], block_size: int
) -> None:
    """One group's block-table rows of the real sequences (the rest keep the idle image's zeros)."""
    a, _ = layout.offsets[_tables(group)]
    w = layout.width
    for i, (s, table) in enumerate(zip(seqs, tables)):
        need = -(-(s.start + len(s.token_ids)) // block_size)
        row = host[a + i * w : a + (i + 1) * w]
        row[:need] = table[:need]
        row[need:] = 0


def fill_idle(host: np.ndarray, layout: Layout) -> None:
    """The metadata a buffer holds between steps, and what a replay of it computes: a batch of
    padding sequences only (token 0 at position 0, written nowhere, one query row and no keys each).
    Valid offsets matter: the attention kernels then run every program and write zeros to every
    output and split-K partial row, overwriting the last step's; all-zero offsets would give every
    sequence no queries, and each program would return before writing anything."""
    host[:] = 0
    fill(host, layout, [], block_size=1)


class PinnedPair:
    """Two pinned host buffers of one layout, used in turn, for the decode graphs' one copy per
    step: a step packs into one while the copy out of the other may still be in flight, so the host
    never waits for a copy (with one step in flight, a buffer's last copy is a step older than the
    step whose results the host has already waited for). After its copy a buffer is reset to the
    idle image: at once when the copy is done, else at its next use or the next `settle`."""

    def __init__(self, layout: Layout, pinned: bool):
        self.layout = layout
        self._bufs = [torch.zeros(layout.size, dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        for b in self._bufs:
            fill_idle(b.numpy(), layout)
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._dirty = [0, 0]  # leading elements holding a step's data
        self._turn = 0

    def upload(self, dst: torch.Tensor, seqs: Sequence[SeqInput], block_size: int) -> int:
        """Pack `seqs` into the next buffer and copy its used prefix to `dst` (non-blocking);
        returns that prefix's length."""
        i = self._turn
        self._turn ^= 1
        self._settle(i, wait=True)
        host = self._bufs[i]
        end = fill(host.numpy(), self.layout, seqs, block_size)
        dst[:end].copy_(host[:end], non_blocking=True)
        if host.is_pinned():
            ev = torch.cuda.Event()
            ev.record()
            self._copied[i] = ev
        self._dirty[i] = end
        return end

    def settle(self, wait: bool) -> None:
        """Reset the buffers whose copies are done (every one, waiting for them, when `wait`)."""
        for i in range(2):
            self._settle(i, wait)

    def _settle(self, i: int, wait: bool) -> None:
        if not self._dirty[i]:
            return
        ev = self._copied[i]
        if ev is not None:
            if not wait and not ev.query():
                return
            ev.synchronize()  # done already (queried, or a step older than the last one waited for)
        fill_idle(self._bufs[i][: self._dirty[i]].numpy(), self.layout)
        self._dirty[i] = 0


class PinnedStaging:
    """A reusable pinned host buffer for one copy per step. Before it is overwritten, the copy that
    last read it must be done: an event recorded after that copy is waited on (a step that samples
    nothing has no other synchronization point)."""

    def __init__(self, pinned: bool = True) -> None:
        """pinned: False where there is no device to copy to (a CPU runs the same packing)."""
        self._pinned = pinned
        self._host = torch.empty(0, dtype=torch.int32)
        self._copied: torch.cuda.Event | None = None
        self._uploads: list[torch.Tensor] = []  # this step's device copies, zeroed by scrub()

    def upload(self, layout: Layout, seqs: Sequence[SeqInput], block_size: int, device: torch.device) -> torch.Tensor:
        """Pack `seqs` and copy the buffer to a new device tensor of layout.size int32."""
        if self._copied is not None:
            self._copied.synchronize()
        if self._host.numel() < layout.size:
            self._host = torch.zeros(
                max(layout.size, 2 * self._host.numel()), dtype=torch.int32, pin_memory=self._pinned
            )
        fill(self._host.numpy(), layout, seqs, block_size)
        dev = self._host[: layout.size].to(device, non_blocking=True)
        if device.type == "cpu":
            dev = dev.clone()  # its own memory, as a device copy is
        else:
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
