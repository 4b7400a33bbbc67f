"""Loading streams: each tensor goes from the memory-mapped safetensors files to the device and
its host copy is dropped before the next layer is read, so loading never holds the model twice.

The decoder is built on the meta device (moving there keeps no data), and every host tensor the
loader reads or hands out is tracked until it is freed: the most bytes alive at once must stay
within one layer's, far below the model's."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import pytest
import torch

from tests.support.families import make_family_model
from traceless.model.hf_loader import load_hf_dir
from traceless.model.lazy_weights import LazyWeights, SafetensorsFiles
from traceless.model.llama import LlamaModel

SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4)


class LiveBytes:
    """Bytes of the tracked tensors still alive, and the most alive at once."""

    def __init__(self):
        self.now = self.peak = 0
        self.seen: set[int] = set()

    def track(self, t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if t.device.type == "cpu" and key not in self.seen:
            self.seen.add(key)
            size = t.untyped_storage().nbytes()
            self.now += size
            self.peak = max(self.peak, self.now)
            weakref.finalize(t, self._free, key, size)
        return t

    def _free(self, key: int, size: int) -> None:
        self.seen.discard(key)
        self.now -= size


@pytest.fixture
def live(monkeypatch):
    tracker = LiveBytes()
    take, pop = SafetensorsFiles.take, LazyWeights.pop

    def tracked_take(self, name):
        t = take(self, name)
        return None if t is None else tracker.track(t)

    def tracked_pop(self, name, *default):
        t = pop(self, name, *default)
        return tracker.track(t) if isinstance(t, torch.Tensor) else t

    monkeypatch.setattr(SafetensorsFiles, "take", tracked_take)
    monkeypatch.setattr(LazyWeights, "pop", tracked_pop)
    return tracker


@pytest.mark.parametrize("kind", ["mistral", "mixtral"])
def test_loading_holds_at_most_one_layer_in_host_memory(kind, tmp_path, live):
    path = make_family_model(tmp_path, kind, **SHAPE)
    total = (path / "model.safetensors").stat().st_size
    config, weights = load_hf_dir(path, torch.float32)
    no_ops = SimpleNamespace(silu_mul=None, gelu_tanh_mul=None)  # built, never run
    model = LlamaModel(config, weights, None, no_ops, torch.device("meta"), False)  # type: ignore[arg-type]
    assert len(model.layers) == 8 and len(weights) == 0
    layer = (total - 2 * 384 * 256 * 4) / 8  # a layer's bytes: all but the embedding and the head
    assert 0 < live.peak <= 1.05 * layer, (live.peak, layer, total)
    assert live.now == 0


def test_an_eager_loader_would_fail_the_bound(tmp_path, live):
    """The check can fail: reading every tensor before building holds the whole model."""
    path = make_family_model(tmp_path, "mistral", **SHAPE)
    total = (path / "model.safetensors").stat().st_size
    config, weights = load_hf_dir(path, torch.float32)
    held = {name: weights.pop(name) for name in list(weights)}
    assert live.peak >= 0.95 * total
    del held
