"""Interoperability with an independent HPKE implementation (pyhpke): for every suite we support,
what one side seals the other opens, in both directions, over several messages of one context,
and both derive the same exporter secrets. Keys come from DeriveKeyPair on both sides, so each
library's key derivation is checked against the other's too."""

from __future__ import annotations

import itertools
import os

import pytest
from pyhpke import AEADId, CipherSuite, KDFId, KEMId

from traceless.privacy.hpke import context as hpke
from traceless.privacy.hpke import kem as hpke_kem
from traceless.privacy.hpke.aead import AeadId
from traceless.privacy.hpke.context import Suite
from traceless.privacy.hpke.kdf import KdfId
from traceless.privacy.hpke.kem import KemId

AEADS = {
    AeadId.AES_128_GCM: AEADId.AES128_GCM,
    AeadId.AES_256_GCM: AEADId.AES256_GCM,
    AeadId.CHACHA20_POLY1305: AEADId.CHACHA20_POLY1305,
}
SUITES = [Suite(k, f, a) for k, f, a in itertools.product(KemId, KdfId, AEADS)]
MESSAGES = [(b"", b"hello"), (b"aad-1", b"x" * 1000), (b"", b"")]


def _theirs(suite: Suite) -> CipherSuite:
    return CipherSuite.new(KEMId(int(suite.kem_id)), KDFId(int(suite.kdf_id)), AEADS[suite.aead_id])


def _keys(suite: Suite):
    ikm = os.urandom(64)
    ours = hpke_kem.derive_key_pair(suite.kem_id, ikm)
    theirs = _theirs(suite).kem.derive_key_pair(ikm)
    assert theirs.public_key.to_public_bytes() == ours.public_key_bytes
    return ours, theirs


@pytest.mark.parametrize("suite", SUITES, ids=lambda s: f"{s.kem_id.name}-{s.kdf_id.name}-{s.aead_id.name}")
def test_we_seal_they_open(suite):
    _, theirs = _keys(suite)
    info = b"traceless interop"
    enc, sender = hpke.setup_base_s(suite, theirs.public_key.to_public_bytes(), info)
    recipient = _theirs(suite).create_recipient_context(enc, theirs.private_key, info)
    for aad, pt in MESSAGES:
        assert recipient.open(sender.seal(aad, pt), aad) == pt
    assert recipient.export(b"ctx", 32) == sender.export(b"ctx", 32)


@pytest.mark.parametrize("suite", SUITES, ids=lambda s: f"{s.kem_id.name}-{s.kdf_id.name}-{s.aead_id.name}")
def test_they_seal_we_open(suite):
    ours, theirs = _keys(suite)
    info = b"traceless interop"
    enc, sender = _theirs(suite).create_sender_context(theirs.public_key, info)
    recipient = hpke.setup_base_r(suite, enc, ours, info)
    for aad, pt in MESSAGES:
        assert recipient.open(aad, sender.seal(pt, aad)) == pt
    assert recipient.export(b"ctx", 32) == sender.export(b"ctx", 32)
