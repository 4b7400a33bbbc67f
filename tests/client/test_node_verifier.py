"""NodeVerifier refusals (threat T15, docs/threat-model.md: fresh attestations, attester policy, clock leeway;
threat T14: the capacity a node may claim is the logged release's)."""

import base64
import time

import pytest

from tests.support.cluster_services import RELEASE, StubReleases
from traceless.privacy.attestation.policy import AttesterPolicy
from traceless.privacy.attestation.software import NodeStatement, SoftwareAttester, new_claims
from traceless.privacy.ohttp.gateway import OhttpServer
from traceless.privacy.ohttp.keys import encode_ohttp_keys
from traceless_tools.client.node_verifier import NodeRefused, NodeVerifier
from traceless_tools.client.private_client import ClientConfig

NONCE = b"n" * 16


def entry(attester, server, ttl=60, now=None, keys=None, nonce=NONCE, capacity=2, measurement=RELEASE.measurement):
    statement = NodeStatement(measurement, server.ohttp_keys(), capacity, "http://node.test")
    claims = new_claims(statement, nonce, int(now or time.time()), attester.attester_type, ttl)
    return {
        "node_id": "n1",
        "attestation": attester.attest(claims),
        "ohttp_keys": base64.b64encode(keys or server.ohttp_keys()).decode(),
    }


def _config(attester, policy=AttesterPolicy.DEVELOPMENT):
    return ClientConfig(
        "http://i",
        "k",
        "http://r",
        "http://127.0.0.1:9",
        b"\x00" * 32,
        (attester.public_key.public_bytes_raw(),),
        "m",
        attester_policy=policy,
    )


@pytest.fixture
def verifier():
    attester = SoftwareAttester()
    v = NodeVerifier(_config(attester), releases=StubReleases(RELEASE))
    yield v, attester
    v.close()


def _reason(v, e, **kw):
    with pytest.raises(NodeRefused) as r:
        v.verify(e, **kw)
    return r.value.reason


def test_a_good_node_is_verified_with_its_attested_capacity(verifier):
    v, attester = verifier
    server = OhttpServer(key_id=3)
    node = v.verify(entry(attester, server, capacity=4), expected_nonce=NONCE)
    assert node.capacity == 4 and node.key_config == server.key_config
    assert node.measurement == RELEASE.combined


def test_expired_forged_and_swapped_key_attestations_are_refused(verifier):
    v, attester = verifier
    server = OhttpServer()
    assert _reason(v, entry(attester, server, ttl=60), now=time.time() + 3600, expected_nonce=NONCE) == "expired"
    assert _reason(v, entry(SoftwareAttester(), server), expected_nonce=NONCE) == "untrusted_key"
    other = OhttpServer()  # a gateway swapping in its own OHTTP key
    assert _reason(v, entry(attester, server, keys=other.ohttp_keys()), expected_nonce=NONCE) == "key_mismatch"
    good = entry(attester, server)
    tampered = dict(
        good, attestation=good["attestation"][:-4] + ("AAAA" if not good["attestation"].endswith("AAAA") else "BBBB")
    )
    assert _reason(v, tampered, expected_nonce=NONCE) in ("bad_signature", "malformed")


def test_a_replayed_attestation_with_another_nonce_is_refused(verifier):
    v, attester = verifier
    stale = entry(attester, OhttpServer(), ttl=3600, nonce=b"old-nonce-0000")
    assert _reason(v, stale, expected_nonce=NONCE) == "stale"
    with pytest.raises(TypeError):
        v.verify(stale)  # the nonce is not optional: a verifier that skips it cannot be built by accident


def test_clock_leeway_accepts_a_node_slightly_ahead_but_not_far(verifier):
    v, attester = verifier
    server = OhttpServer()
    assert v.verify(entry(attester, server, now=time.time() + 30), expected_nonce=NONCE).capacity == 2
    assert _reason(v, entry(attester, server, now=time.time() + 300), expected_nonce=NONCE) == "expired"


def test_the_software_attester_needs_the_development_policy():
    attester = SoftwareAttester()
    assert (
        ClientConfig("http://i", "k", "http://r", "http://l", b"\x00" * 32, (), "m").attester_policy
        is AttesterPolicy.PRODUCTION
    )  # the default
    v = NodeVerifier(_config(attester, AttesterPolicy.PRODUCTION), releases=StubReleases(RELEASE))
    try:
        assert _reason(v, entry(attester, OhttpServer()), expected_nonce=NONCE) == "attester_type"
    finally:
        v.close()


def test_capacity_must_be_one_the_logged_release_allows(verifier):
    v, attester = verifier
    assert _reason(v, entry(attester, OhttpServer(), capacity=1000), expected_nonce=NONCE) == "capacity_not_allowed"
    from traceless.privacy.attestation.measurement import Measurement

    other = Measurement(b"\x07" * 32, b"\x02" * 32, b"\x03" * 32)
    assert _reason(v, entry(attester, OhttpServer(), measurement=other), expected_nonce=NONCE) == "not_in_log"


def test_every_current_key_is_bound_and_the_newest_is_used(verifier):
    v, attester = verifier
    old, new = OhttpServer(key_id=1), OhttpServer(key_id=2)
    both = encode_ohttp_keys([new.key_config, old.key_config])
    statement = NodeStatement(RELEASE.measurement, both, 1, "http://node.test")
    claims = new_claims(statement, NONCE, int(time.time()), "software", 60)
    node = v.verify(
        {"node_id": "n", "attestation": attester.attest(claims), "ohttp_keys": base64.b64encode(both).decode()},
        expected_nonce=NONCE,
    )
    assert node.key_config == new.key_config


def test_an_unreadable_log_refuses_the_node():
    attester = SoftwareAttester()
    v = NodeVerifier(_config(attester))  # the real release index, over a log that is not there
    try:
        assert _reason(v, entry(attester, OhttpServer()), expected_nonce=NONCE) == "log_error"
    finally:
        v.close()


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"prefix_cache": "global"}, "release_prefix_cache"),
        ({"shape_padding": "off"}, "release_unpadded"),
        ({"scrub_freed_memory": False}, "release_unscrubbed"),
        ({"load_format": "dummy"}, "release_dummy_weights"),
        ({"request_events": True}, "release_request_events"),
        ({"shape_padding": None}, "release_unpadded"),  # not stated counts as off
        ({"metrics_epsilon": None}, "release_metrics_epsilon"),  # exact telemetry (off), or not stated
        ({"metrics_epsilon": 4.0}, "release_metrics_epsilon"),  # noise weaker than the policy allows
        ({"metrics_epsilon": True}, "release_metrics_epsilon"),
    ],
)
def test_a_logged_release_that_does_not_say_private_settings_is_refused(change, reason):
    from tests.support.cluster_services import PRIVATE_SETTINGS
    from traceless.privacy.translog.manifest import ReleaseManifest

    config = {k: v for k, v in (PRIVATE_SETTINGS | change).items() if v is not None}
    release = ReleaseManifest(b"\x07" * 32, b"\x08" * 32, config, (1, 2))
    attester = SoftwareAttester()
    v = NodeVerifier(_config(attester), releases=StubReleases(release))
    try:
        e = entry(attester, OhttpServer(), measurement=release.measurement)
        assert _reason(v, e, expected_nonce=NONCE) == reason
    finally:
        v.close()


@pytest.mark.parametrize(
    "waiver, change",
    [
        ("unpadded", {"shape_padding": "off"}),
        ("request_events", {"request_events": True}),
        ("dummy_weights", {"load_format": "dummy"}),
    ],
)
def test_a_benchmark_waiver_accepts_exactly_its_setting(waiver, change):
    from dataclasses import replace

    from tests.support.cluster_services import PRIVATE_SETTINGS
    from traceless.privacy.translog.manifest import ReleaseManifest
    from traceless.privacy.translog.release_policy import ReleasePolicy

    release = ReleaseManifest(b"\x07" * 32, b"\x08" * 32, PRIVATE_SETTINGS | change, (1, 2))
    worse = ReleaseManifest(b"\x07" * 32, b"\x08" * 32, PRIVATE_SETTINGS | change | {"prefix_cache": "global"}, (1,))
    attester = SoftwareAttester()
    policy = ReleasePolicy.from_waivers([waiver])
    assert policy == ReleasePolicy.waiving_for(release.config) and policy.waivers == (waiver,)
    v = NodeVerifier(replace(_config(attester), release_policy=policy), releases=StubReleases(release, worse))
    try:
        assert v.verify(entry(attester, OhttpServer(), measurement=release.measurement), expected_nonce=NONCE)
        e = entry(attester, OhttpServer(), measurement=worse.measurement, capacity=1)
        assert _reason(v, e, expected_nonce=NONCE) == "release_prefix_cache"
    finally:
        v.close()
    with pytest.raises(ValueError):
        ReleasePolicy.from_waivers(["global_prefix_cache"])


def test_one_node_listed_under_many_ids_refuses_the_round():
    """Node aliases: the gateway lists the attacker's node under 9 node ids next to one honest node;
    verifying every copy and drawing by their summed capacity gave the attacker 9/10 of the draws."""
    from traceless_tools.client.node_choice import draw_node

    honest, evil = SoftwareAttester(), SoftwareAttester()
    v = NodeVerifier(
        ClientConfig(
            "http://i",
            "k",
            "http://r",
            "http://127.0.0.1:9",
            b"\x00" * 32,
            (honest.public_key.public_bytes_raw(), evil.public_key.public_bytes_raw()),
            "m",
            attester_policy=AttesterPolicy.DEVELOPMENT,
        ),
        releases=StubReleases(RELEASE),
    )
    try:
        evil_server = OhttpServer(key_id=4)
        listing = [{**entry(honest, OhttpServer(key_id=3)), "node_id": "honest"}]
        listing += [{**entry(evil, evil_server), "node_id": f"alias{i}"} for i in range(9)]
        refused = False
        try:
            nodes = v.verify_all(listing, NONCE)
        except Exception as exc:  # DuplicateListingError
            refused = "more than once" in str(exc)
            nodes = []
        draws = [draw_node(nodes).node_id for _ in range(200)] if nodes else []
    finally:
        v.close()
    assert refused, f"the aliases were drawn {sum(d.startswith('alias') for d in draws)} of {len(draws)} times"
