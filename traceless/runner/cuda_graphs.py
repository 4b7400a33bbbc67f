"""Decode steps replayed from CUDA graphs: no per-layer Python, no per-kernel launch cost.

At start, one graph per batch size of a ladder (vLLM's: 1, 2, 4, then every multiple of 8 up to
max_num_seqs) is captured over static buffers: the packed step metadata (step_meta.py) and the
logits it produces. A decode step of n sequences (one new token each, one logit row each) is
padded up to the next captured size: its metadata is packed in pinned memory, copied in ONE
host-to-device copy, and the graph is replayed; padding rows write no K/V (slot block -1) and
belong to padding sequences with no keys (their attention output is zero). Anything else (prefill
chunks, drafts, more sequences than the largest graph, contexts wider than the captured block
tables) runs eagerly.

After every replay the runner scrubs: the host and device metadata (token ids, positions, block
tables) and the graphs' output hidden states are zeroed; the logits the sampler read are zeroed by
the runner as on every path. (Intermediate activations inside the graphs' memory pool are
overwritten by the next replay; `audit residue --device cuda` measures what is left.)
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence

import torch

from traceless.model.layers.attention import AttentionMetadata
from traceless.model.llama import LlamaModel
from traceless.runner.batch import SeqInput, paged_meta
from traceless.runner.step_meta import Layout, PinnedPair, fill_idle

# Contexts longer than this run eagerly: it bounds the captured block tables (vLLM's
# max_seq_len_to_capture is 8192 too) and so the bytes of the one copy per step.
MAX_CAPTURED_CONTEXT = 8192


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, ... up to max_num_seqs, which is always included."""
    sizes = [s for s in (1, 2, 4) if s <= max_num_seqs] + list(range(8, max_num_seqs + 1, 8))
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


def padded_size(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size that holds n sequences; None when n is above the largest."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def is_plain_decode(seqs: Sequence[SeqInput]) -> bool:
    """One known token and one logit row per sequence: the only step shape the graphs hold."""
    return all(len(s.token_ids) == 1 and s.num_logits == 1 for s in seqs)


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaModel,
        sizes: list[int],
        block_size: int,
        max_model_len: int,
        device: torch.device,
        scale: float,
        kv_groups: int = 1,
    ):
        """kv_groups: the model's KV groups (model/kv_groups.py), each with its own block tables."""
        self.model = model
        self.sizes = sizes
        self.block_size = block_size
        width = -(-min(max_model_len, MAX_CAPTURED_CONTEXT) // block_size)
        self.layout = Layout(rows=sizes[-1], logits=sizes[-1], seqs=sizes[-1], width=width, groups=kv_groups)
        self.host = PinnedPair(self.layout, pinned=device.type == "cuda")
        idle = torch.zeros(self.layout.size, dtype=torch.int32)
        fill_idle(idle.numpy(), self.layout)
        self._idle = idle.to(device)  # the idle image, resident: a scrub is one device-to-device copy
        self.buf = self._idle.clone()
        self._views = self.layout.views(self.buf)
        self.device = device
        self.scale = scale
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool: tuple[int, int] | None = None  # the graphs' private memory pool (zeroed by device_scrub.py)
        self._last: int | None = None  # the size replayed since the last scrub
        self._written = self.layout.size  # leading elements of the device buffer that may hold a step's data
        self.capture_s = 0.0

    def fits(self, seqs: Sequence[SeqInput]) -> bool:
        if not seqs or padded_size(len(seqs), self.sizes) is None or not is_plain_decode(seqs):
            return False
        return max(s.start + 1 for s in seqs) <= self.layout.width * self.block_size

    def _meta(self, n: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        v = self._views
        meta = paged_meta(v, self.layout.groups, n, 1, self.scale, rows=n)
        return v["ids"][:n], v["positions"][:n], meta

    def _forward(self, n: int) -> torch.Tensor:
        ids, positions, meta = self._meta(n)
        return self.model.forward(ids, positions, meta)  # [n, hidden]

    def capture(self) -> float:
        """Capture every size (largest first, sharing one memory pool); returns the seconds taken."""
        t0 = time.monotonic()
        self.scrub()
        pool = None
        with torch.inference_mode():
            for n in reversed(self.sizes):
                self._forward(n)  # compiles the kernels for this shape and warms cuBLAS
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self._forward(n)
                pool = graph.pool()
                self._graphs[n] = (graph, out)
        self.pool = pool
        torch.cuda.synchronize(self.device)
        self.scrub()
        self.capture_s = time.monotonic() - t0
        return self.capture_s

    def run(self, seqs: Sequence[SeqInput], patch_ids: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Replay the graph of the next size up: the logits of `seqs` in order, [n, V] float32
        (computed after the replay: a [size, V] output per captured size would cost hundreds of
        MB at a 128k vocabulary; the caller zeroes them when done). patch_ids(ids [n]) runs after
        the metadata's copy and before the replay (token ids that are still on the device)."""
        n = padded_size(len(seqs), self.sizes)
        if n is None:
            raise ValueError("more sequences than the largest captured decode graph")
        graph, out = self._graphs[n]
        self._last = n
        self._written = self.host.upload(self.buf, seqs, self.block_size)
        if patch_ids is not None:
            patch_ids(self._views["ids"][: len(seqs)])
        graph.replay()
        return self.model.logits(out[: len(seqs)])

    def scrub(self) -> None:
        """After a replay, without waiting for the device: the device metadata back to the idle
        image (a device-to-device copy queued after the step), the hidden states of the graph that
        ran zeroed, and the host buffer reset once its copy is done (PinnedPair)."""
        end = self._written
        with torch.inference_mode():  # the buffers are inference tensors
            self.buf[:end].copy_(self._idle[:end])
            if self._last is not None:
                self._graphs[self._last][1].zero_()
        self.host.settle(wait=False)
        self._last = None
        self._written = 0

    def settle(self) -> None:
        """Reset the host buffers whose copies are done (the sweep after a step; a copy not done yet
        belongs to a step whose results are still to be waited for, and a later sweep resets it)."""
        self.host.settle(wait=False)
