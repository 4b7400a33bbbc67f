import pytest
import torch

from traceless.model.config import ModelConfig
from traceless.model.layers.kv_cache import KVCache
from traceless.modes import KVOffload
from traceless.runner.offload import KVOffloader, OffloadError

CFG = ModelConfig(
    architecture="llama",
    vocab_size=100,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=64,
    tie_word_embeddings=True,
    qkv_bias=False,
)


def filled_cache(dtype=torch.bfloat16):
    cache = KVCache(CFG, 10, 4, dtype, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    return cache


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_round_trip_restores_the_exact_kv_into_other_blocks(tmp_path, mode):
    cache = filled_cache()
    off = KVOffloader(cache, KVOffload(mode), tmp_path / "spill")
    want_k, want_v = cache.k[:, [2, 5, 7]].clone(), cache.v[:, [2, 5, 7]].clone()
    off.save("r1", [2, 5, 7])
    if mode == "disk":
        (spill,) = list((tmp_path / "spill").iterdir())
        assert "r1" not in spill.name and spill.stat().st_mode & 0o777 == 0o600
    off.restore("r1", [1, 3, 4])
    assert torch.equal(cache.k[:, [1, 3, 4]], want_k) and torch.equal(cache.v[:, [1, 3, 4]], want_v)
    assert off.num_swapped() == 0 and not any((tmp_path / "spill").iterdir()) if mode == "disk" else True


def test_tampered_spill_is_refused_and_shredded(tmp_path):
    cache = filled_cache()
    off = KVOffloader(cache, KVOffload.DISK, tmp_path)
    off.save("r1", [1, 2])
    (spill,) = list(tmp_path.iterdir())
    data = bytearray(spill.read_bytes())
    data[40] ^= 1
    spill.write_bytes(bytes(data))
    with pytest.raises(OffloadError):
        off.restore("r1", [3, 4])
    assert not any(tmp_path.iterdir()) and off.num_swapped() == 0


def test_discard_destroys_key_and_file(tmp_path):
    cache = filled_cache()
    off = KVOffloader(cache, KVOffload.DISK, tmp_path)
    off.save("r1", [1])
    key = off._swapped["r1"].key
    off.discard("r1")
    assert not any(tmp_path.iterdir()) and not any(key) and off.num_swapped() == 0
    with pytest.raises(OffloadError):
        off.restore("r1", [1])


@pytest.mark.parametrize("mode", ["memory", "disk"])
def test_a_failed_decryption_zeroes_its_staging_buffer(tmp_path, monkeypatch, mode):
    """decrypt_into writes unauthenticated plaintext into its output before it raises InvalidTag:
    the staging buffer must be zero when restore gives up, and the target blocks untouched."""
    cache = filled_cache()
    off = KVOffloader(cache, KVOffload(mode), tmp_path)
    off.save("r1", [1, 2])
    entry = off._swapped["r1"]
    if mode == "memory":
        blob = bytearray(entry.blob)
        blob[-1] ^= 1  # the tag: decrypt_into has written the whole plaintext before it checks it
        entry.blob = bytes(blob)
    else:
        data = bytearray(entry.path.read_bytes())
        data[-1] ^= 1
        entry.path.write_bytes(bytes(data))
    staged = []
    real_empty = torch.empty

    def spy_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        staged.append(t)
        return t

    monkeypatch.setattr(torch, "empty", spy_empty)
    before_k, before_v = cache.k[:, [3, 4]].clone(), cache.v[:, [3, 4]].clone()
    with pytest.raises(OffloadError):
        off.restore("r1", [3, 4])
    monkeypatch.undo()
    assert staged and all(not t.any() for t in staged)
    assert torch.equal(cache.k[:, [3, 4]], before_k) and torch.equal(cache.v[:, [3, 4]], before_v)
    assert off.num_swapped() == 0 and not any(entry.key)


@pytest.mark.parametrize("mode", [KVOffload.NONE, "disk"])
def test_an_offloader_needs_a_memory_or_disk_member(tmp_path, mode):
    with pytest.raises(ValueError, match="memory or disk"):
        KVOffloader(filled_cache(), mode, tmp_path)
