"""Small host-to-device uploads that never wait for the device.

`torch.tensor(values, device=cuda)` copies from pageable memory, and a blocking copy from pageable
memory synchronizes the stream: every such call in a step makes the host wait for all the work
queued before it. Here the values go through pinned memory with a non-blocking copy (PyTorch's
pinned-memory cache keeps the host buffer until the copy is done). On a CPU it is a plain tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def upload(values: Sequence, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """values as a [len(values)] tensor on `device`, queued behind the stream's work."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype)
    host = torch.tensor(values, dtype=dtype, pin_memory=True)
    return host.to(device, non_blocking=True)
