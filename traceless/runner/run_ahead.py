"""Steps launched ahead of their results (asynchronous scheduling, as vLLM does it).

The engine schedules and launches step n + 1 before it reads step n's sampled tokens. A decoding
sequence of step n + 1 then feeds the token step n sampled, which only the device knows: the plan
marks it (ScheduledSeq.device_tokens) with a placeholder id, and this module writes the real id
into the step's token-id buffer on the device, from step n's sampled ids, before the forward. The
sampled ids of a launched step come back with ONE non-blocking copy into pinned memory; the host
waits for it only when it reads them (PendingStep.result), a step later.

Only plain steps run ahead (the engine decides, engine/llm_engine.py): every row samples at most
one token with no drafts, logprobs, prompt logprobs, penalties, logit bias or grammar; everything
else needs tokens on the host and runs synchronously.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from traceless.engine.step_io import SampledTokens, ScheduledSeq
from traceless.runner.device_io import upload


@dataclass
class PendingStep:
    """A launched step's sampled ids, on their way to the host. host: [R] int64 (pinned on CUDA)
    in the order of request_ids; ready: recorded after the copy (None on a CPU)."""

    request_ids: list[str]
    host: torch.Tensor
    ready: torch.cuda.Event | None

    def result(self) -> dict[str, SampledTokens]:
        """Wait for the copy, read the ids, and wipe the pinned buffer."""
        if self.ready is not None:
            self.ready.synchronize()
        ids = self.host.tolist()
        with torch.inference_mode():  # (an inference tensor)
            self.host.zero_()
        return {rid: SampledTokens([t], None) for rid, t in zip(self.request_ids, ids)}


class DeviceTokens:
    """The last launched step's sampled ids, kept on the device for the next step's inputs."""

    def __init__(self, device: torch.device):
        self.device = device
        self._ids: torch.Tensor | None = None  # [R] int64, the last launched step's
        self._rows: dict[str, int] = {}  # request id -> its row in _ids

    def patch(self, ids: torch.Tensor, seqs: Sequence[ScheduledSeq], last_row: list[int]) -> None:
        """Write into ids (the step's packed token ids) the tokens the sequences take from the
        device: sequence i's last token sits at row last_row[i]."""
        dst, src = [], []
        for i, s in enumerate(seqs):
            if s.device_tokens:
                if s.device_tokens != 1 or s.request_id not in self._rows:
                    raise RuntimeError("a plan takes a token from the device that the last step did not sample")
                dst.append(last_row[i])
                src.append(self._rows[s.request_id])
        if not dst:
            return
        if self._ids is None:
            raise RuntimeError("a plan takes tokens from the device before any step sampled")
        picked = self._ids[upload(src, torch.int64, self.device)].to(ids.dtype)
        ids[upload(dst, torch.int64, self.device)] = picked
        picked.zero_()

    def keep(self, ids: torch.Tensor, request_ids: list[str]) -> None:
        """ids: [R] int64, this step's sampled tokens (request_ids in row order)."""
        self.clear()
        self._ids, self._rows = ids, {rid: j for j, rid in enumerate(request_ids)}

    def send_home(self, ids: torch.Tensor, request_ids: list[str]) -> PendingStep:
        """Start the one copy of this step's ids to the host."""
        if self.device.type == "cpu":
            return PendingStep(request_ids, ids.clone(), None)
        host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        host.copy_(ids, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return PendingStep(request_ids, host, ready)

    def forget(self, request_id: str) -> None:
        """A request ended: once no row is wanted, the ids are zeroed and dropped."""
        self._rows.pop(request_id, None)
        if not self._rows:
            self.clear()

    def clear(self) -> None:
        if self._ids is not None:
            with torch.inference_mode():  # (an inference tensor)
                self._ids.zero_()  # token ids (queued after every step that reads them)
        self._ids, self._rows = None, {}


def last_rows(lengths: list[int], order: list[int]) -> list[int]:
    """Row of each sequence's last token when the sequences (token counts `lengths`) are packed
    one after another in `order`; indexed like `lengths`."""
    out = [0] * len(lengths)
    row = 0
    for i in order:
        row += lengths[i]
        out[i] = row - 1
    return out
