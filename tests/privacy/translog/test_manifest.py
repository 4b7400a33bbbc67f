"""Log leaves are readable entries that decode strictly and round-trip byte for byte."""

import json

import pytest

from traceless.privacy.attestation.measurement import combine, config_digest
from traceless.privacy.translog.manifest import (
    IssuerKeyEntry,
    ManifestError,
    ReleaseManifest,
    decode_leaf,
)

CONFIG = {"component": "node", "prefix_cache": "isolated", "shape_padding": "buckets", "scrub_freed_memory": True}


def release(**kw):
    fields = dict(code=b"\x01" * 32, model=b"\x02" * 32, config=CONFIG, capacities=(1, 2))
    fields.update(kw)
    return ReleaseManifest(**fields)


def test_a_release_round_trips_and_says_what_it_runs():
    m = release()
    leaf = m.encode()
    entry = json.loads(leaf)
    assert entry["config"]["prefix_cache"] == "isolated" and entry["capacities"] == [1, 2]
    assert bytes.fromhex(entry["combined"]) == combine(b"\x01" * 32, b"\x02" * 32, config_digest(CONFIG))
    assert decode_leaf(leaf) == m and m.allows_capacity(2) and not m.allows_capacity(3)


def test_an_issuer_key_round_trips():
    k = IssuerKeyEntry("issuer.example", b"\x30\x82" + b"k" * 40, 100, 200)
    assert decode_leaf(k.encode()) == k and k.valid_at(150) and not k.valid_at(200)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda e: e.update(combined="00" * 32),  # says one thing, attests another
        lambda e: e.update(capacities=[2, 1]),
        lambda e: e.update(capacities=[]),
        lambda e: e.update(capacities=[True]),
        lambda e: e.update(code="01" * 31),
        lambda e: e.update(code="AB" * 32),
        lambda e: e.update(extra=1),
        lambda e: e.pop("model"),
        lambda e: e.update(schema="traceless/release/v0"),
        lambda e: e.update(config=[1]),
    ],
)
def test_malformed_releases_are_refused(mutate):
    entry = json.loads(release().encode())
    mutate(entry)
    with pytest.raises(ManifestError):
        decode_leaf(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode())


def test_only_the_canonical_encoding_is_a_leaf():
    leaf = release().encode()
    with pytest.raises(ManifestError):
        decode_leaf(json.dumps(json.loads(leaf), indent=1).encode())
    for junk in (b"", b"\xff", b"[]", b"null", b"{" * 100_000):
        with pytest.raises(ManifestError):
            decode_leaf(junk)
