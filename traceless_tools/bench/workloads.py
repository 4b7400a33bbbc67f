"""Deterministic offline workloads shared by our benchmark and the peer-engine scripts.

Pure Python (no torch, no traceless imports) so that a script running in another engine's
virtual environment can import this file and feed that engine exactly the same token ids.
Prompts are token-id lists drawn from a fixed seed over ordinary vocabulary ids (no special
tokens); output length is fixed (ignore EOS), so every engine does the same work.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Ordinary-token id range: above the special/control tokens every supported tokenizer keeps at the
# start of its vocabulary, and below the smallest vocabulary we run (SmolLM2: 49,152).
_ID_LOW, _ID_HIGH = 1_000, 40_000


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    description: str
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def _prompts(seed: int, count: int, length: int) -> tuple[tuple[int, ...], ...]:
    rng = random.Random(seed)
    return tuple(tuple(rng.randrange(_ID_LOW, _ID_HIGH) for _ in range(length)) for _ in range(count))


def _repeated(seed: int, count: int, length: int, times: int) -> tuple[tuple[int, ...], ...]:
    """Each prompt: a random passage of `length` ids written out `times` times (the model is shown
    a text over and over and continues it: the case prompt lookup is made for)."""
    return tuple(p * times for p in _prompts(seed, count, length))


def offline_workloads() -> dict[str, Workload]:
    """W1 single stream, W2 batch, W3 long prompts (the engine's speed cases); W4 repetitive
    text (speculative decoding); W5 a large batch of longer prompts (the GPU's throughput case)."""
    return {
        "W1": Workload("W1", "single stream: 1 x 128-token prompt, 128 output tokens", _prompts(1, 1, 128), 128),
        "W2": Workload("W2", "batch: 64 distinct 128-token prompts, 128 output tokens each", _prompts(2, 64, 128), 128),
        "W3": Workload("W3", "long prompts: 4 x 1024-token prompts, 64 output tokens each", _prompts(3, 4, 1024), 64),
        "W4": Workload(
            "W4",
            "repetitive: 4 x a 64-token passage repeated 3 times (192 tokens), 128 output tokens each",
            _repeated(4, 4, 64, 3),
            128,
        ),
        "W5": Workload(
            "W5", "large batch: 256 x 512-token prompts, 128 output tokens each", _prompts(5, 256, 512), 128
        ),
    }
