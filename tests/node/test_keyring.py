"""OHTTP keys rotate on a schedule with an overlap window, and a repeated encapsulated request is
dropped (threat T19, docs/threat-model.md: one key_id for the life of the process, no replay cache)."""

import pytest

from traceless.node.keyring import KeyRing, ReplayCacheFullError, ReplayedRequestError
from traceless.privacy.ohttp.call import encapsulate_call
from traceless.privacy.ohttp.keys import decode_ohttp_keys


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _request(config):
    return encapsulate_call(config, b"/v1/completions", b"{}", stream=False).body


def test_keys_rotate_with_an_overlap_window():
    clock = Clock()
    ring = KeyRing(rotation_s=100, overlap_s=30, clock=clock)
    first = ring.current.key_config
    assert decode_ohttp_keys(ring.ohttp_keys()) == (first,)
    old_request = _request(first)
    clock.now += 100  # due: a new key, the old one still accepted for the overlap
    second = ring.current.key_config
    assert second.key_id != first.key_id and second.public_key != first.public_key
    assert decode_ohttp_keys(ring.ohttp_keys()) == (second, first)  # newest first, every live key listed
    assert ring.server_for(old_request) is not None
    clock.now += 30  # the overlap is over: the old key is gone
    assert decode_ohttp_keys(ring.ohttp_keys()) == (second,)
    assert ring.server_for(old_request) is None
    assert ring.server_for(_request(second)) is not None


def test_a_replayed_request_is_refused_while_its_key_lives():
    clock = Clock()
    ring = KeyRing(rotation_s=100, overlap_s=30, clock=clock)
    request = _request(ring.current.key_config)
    ring.admit(request)
    with pytest.raises(ReplayedRequestError):
        ring.admit(request)
    with pytest.raises(ReplayedRequestError):  # the same enc with another ciphertext is the same request
        ring.admit(request[:-1] + bytes([request[-1] ^ 1]))
    ring.admit(_request(ring.current.key_config))  # a fresh encapsulation is fine
    clock.now += 130  # the key retired: its cache goes with it (its requests can no longer be opened)
    assert ring.replay_entries() == 0


def test_the_replay_cache_is_bounded_and_refuses_rather_than_forgets():
    ring = KeyRing(rotation_s=100, overlap_s=30, clock=Clock(), max_replay_entries=2)
    ring.admit(_request(ring.current.key_config))
    ring.admit(_request(ring.current.key_config))
    with pytest.raises(ReplayCacheFullError):
        ring.admit(_request(ring.current.key_config))


def test_rotation_settings_are_checked():
    with pytest.raises(ValueError):
        KeyRing(rotation_s=10, overlap_s=20)
    with pytest.raises(ValueError):
        KeyRing(rotation_s=0, overlap_s=0)
