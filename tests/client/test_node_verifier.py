"""NodeVerifier refusals that need no network (attestation checks come before the log)."""
import base64
import time

import pytest

from traceless.client.node_verifier import NodeRefused, NodeVerifier
from traceless.client.private_client import ClientConfig
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import SoftwareAttester, new_claims
from traceless.privacy.ohttp.gateway import OhttpServer


def entry(attester, server, ttl=60, now=None, key_config=None):
    claims = new_claims(Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32), server.key_config.encode(),
                        b"n" * 16, int(now or time.time()), "software", ttl)
    return {"node_id": "n1", "capacity": 1, "attestation": attester.attest(claims),
            "ohttp_keys": base64.b64encode(key_config or server.ohttp_keys()).decode()}


@pytest.fixture
def verifier():
    attester = SoftwareAttester()
    cfg = ClientConfig("http://i", "k", "http://r", "http://127.0.0.1:9", b"\x00" * 32,
                       (attester.public_key.public_bytes_raw(),), "m")
    v = NodeVerifier(cfg)
    yield v, attester
    v.close()


def test_expired_forged_and_swapped_key_attestations_are_refused(verifier):
    v, attester = verifier
    server = OhttpServer()
    with pytest.raises(NodeRefused) as r:
        v.verify(entry(attester, server, ttl=60), now=time.time() + 3600)
    assert r.value.reason == "expired"
    with pytest.raises(NodeRefused) as r:
        v.verify(entry(SoftwareAttester(), server))  # signed by a key the client does not trust
    assert r.value.reason == "untrusted_key"
    other = OhttpServer()  # a gateway swapping in its own OHTTP key
    with pytest.raises(NodeRefused) as r:
        v.verify(entry(attester, server, key_config=other.ohttp_keys()))
    assert r.value.reason == "key_mismatch"
    good = entry(attester, server)
    tampered = dict(good, attestation=good["attestation"][:-4]
                    + ("AAAA" if not good["attestation"].endswith("AAAA") else "BBBB"))
    with pytest.raises(NodeRefused) as r:
        v.verify(tampered)
    assert r.value.reason in ("bad_signature", "malformed")
    with pytest.raises(NodeRefused) as r:  # a valid attestation, but the log is unreachable: refuse, never assume
        v.verify(good)
    assert r.value.reason == "log_error"
