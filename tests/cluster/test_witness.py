"""The witness, the log's cosigned tree heads and the client's witness policy, over real HTTP:
cosigning, refusals (unwitnessed, stale, forked), the persisted tree head across restarts."""

import logging
import os
import time

import httpx
import pytest

from tests.support.log_service import rewrite_history
from traceless.privacy.translog.client import (
    InconsistentLogError,
    LogClient,
    PublicKeyMismatchError,
    StaleLogError,
    WitnessCheckError,
)
from traceless.privacy.translog.cosignature import WitnessPolicy, cosign
from traceless.privacy.translog.log import TransparencyLog
from traceless.privacy.translog.witness import KEY_FILE, STATE_FILE, Witness, WitnessError
from traceless_tools.cluster.witness_service import run, witness_once

LEAVES = [bytes([i]) * 32 for i in range(1, 4)]


@pytest.fixture
def setup(tmp_path, log_service):
    """A log of three leaves served with one witness (its key known to the log), not yet run."""
    log = TransparencyLog.create(tmp_path / "log")
    log.append_batch(LEAVES)
    witness = Witness(tmp_path / "witness", log.public_key_bytes())
    url = log_service(tmp_path / "log", (witness.public_key,))
    return log, witness, url


def _witness(witness, url):
    with httpx.Client(timeout=10) as http, LogClient(url, witness.log_public_key, http=http) as log:
        return witness_once(witness, log, http, url)


def _client(log, url, witness_keys, **kw):
    policy = WitnessPolicy(tuple(witness_keys), max_age_s=kw.pop("max_age_s", 600.0))
    return LogClient(url, log.public_key_bytes(), witness=policy, **kw)


def test_a_witnessed_head_is_accepted_and_persisted_0600(setup, tmp_path):
    log, witness, url = setup
    assert _witness(witness, url).sth == log.sth
    state = tmp_path / "client" / "log-state.json"
    state.parent.mkdir()
    with _client(log, url, [witness.public_key], state_path=state) as client:
        assert client.update() == log.sth
    assert os.stat(state).st_mode & 0o777 == 0o600
    for name in (KEY_FILE, STATE_FILE):
        assert os.stat(tmp_path / "witness" / name).st_mode & 0o777 == 0o600
    with _client(log, url, [witness.public_key], state_path=state) as restarted:
        assert restarted.last_sth == log.sth  # the restart starts from the saved head


def test_a_head_without_a_trusted_cosignature_is_refused(setup):
    log, witness, url = setup
    with _client(log, url, [witness.public_key]) as client, pytest.raises(WitnessCheckError):
        client.update()  # the witness has not cosigned yet
    _witness(witness, url)
    other = Witness(setup[0]._dir.parent / "other", log.public_key_bytes())
    with _client(log, url, [other.public_key]) as client, pytest.raises(WitnessCheckError):
        client.update()  # cosigned, but by a witness this client does not trust
    with _client(log, url, []) as client, pytest.raises(WitnessCheckError, match="no witness key"):
        client.update()


def test_a_stale_cosignature_is_refused(setup):
    log, witness, url = setup
    _witness(witness, url)
    later = time.time() + 601
    with _client(log, url, [witness.public_key], clock=lambda: later) as client, pytest.raises(StaleLogError):
        client.update()
    with _client(log, url, [witness.public_key], clock=lambda: later - 2) as client:
        client.update()  # just inside the bound


def test_the_log_takes_only_valid_cosignatures_of_its_current_head_from_its_witnesses(setup, tmp_path):
    log, witness, url = setup
    stranger = Witness(tmp_path / "stranger", log.public_key_bytes())
    now = time.time_ns() // 1_000_000
    with httpx.Client(timeout=10) as http, LogClient(url, log.public_key_bytes(), http=http) as lc:
        head = stranger.cosign_latest(lc, now)
        post = lambda body: http.post(url + "/log/v1/cosignature", json=body)  # noqa: E731
        assert post({"sth": head.sth.to_json(), "cosignature": head.cosignature.to_json()}).status_code == 403
        own = witness.cosign_latest(lc, now)
        forged = own.cosignature.to_json() | {"timestamp": now + 1}  # signature no longer matches
        assert post({"sth": own.sth.to_json(), "cosignature": forged}).status_code == 400
        assert post({"sth": "x"}).status_code == 400
        log.append(b"\x09" * 32)  # a new head: the cosignature of the old one is not taken
        assert post({"sth": own.sth.to_json(), "cosignature": own.cosignature.to_json()}).status_code == 409
        assert http.get(url + "/log/v1/sth/cosigned").json()["cosignatures"] == []


def test_a_forked_log_same_size_is_detected_by_the_witness_and_the_clients(setup, tmp_path, caplog, log_service):
    caplog.set_level(logging.INFO, logger="traceless.events")
    log, witness, url = setup
    _witness(witness, url)
    state = tmp_path / "client-state.json"
    with _client(log, url, [witness.public_key], state_path=state) as client:
        seen = client.update()
    # The operator shows a second head of the same size (different root), signed with the log's key.
    rewrite_history(tmp_path / "log", [LEAVES[0], b"\xee" * 32, LEAVES[2]])
    forked = TransparencyLog.open(tmp_path / "log").sth
    assert forked.tree_size == seen.tree_size and forked.root_hash != seen.root_hash
    assert _witness(witness, url) is None  # the witness refuses to cosign it ...
    assert any(
        '"event":"witness.refused"' in r.getMessage() and '"reason":"inconsistent"' in r.getMessage()
        for r in caplog.records
    )
    assert _witness(Witness(tmp_path / "witness", log.public_key_bytes()), url) is None  # ... also after a restart
    with _client(log, url, [witness.public_key]) as fresh, pytest.raises(WitnessCheckError):
        fresh.update()  # so a client with no history refuses the fork too: it is unwitnessed
    # A colluding witness with no history cosigns the fork; a client that kept its head still refuses it.
    colluder = Witness(tmp_path / "colluder", log.public_key_bytes())
    url2 = log_service(tmp_path / "log", (colluder.public_key,))
    assert _witness(colluder, url2).sth == forked
    with _client(log, url2, [colluder.public_key]) as fresh:
        assert fresh.update() == forked  # with no history, a fork cosigned by a bad witness passes ...
    with _client(log, url2, [colluder.public_key], state_path=state) as restarted, pytest.raises(InconsistentLogError):
        restarted.update()  # ... but not for a client that kept the head it verified before its restart


def test_the_witness_pins_one_log_and_the_client_its_key(setup, tmp_path):
    log, witness, url = setup
    _witness(witness, url)
    with pytest.raises(WitnessError):
        Witness(tmp_path / "witness", bytes(32))  # not the log this directory witnessed before
    state = tmp_path / "s.json"
    with _client(log, url, [witness.public_key], state_path=state) as client:
        client.update()
    with pytest.raises(PublicKeyMismatchError):
        LogClient(url, bytes(32), state_path=state)


def test_run_rounds_cosign_the_growing_log(setup):
    log, witness, url = setup
    slept = []
    run(witness, url, 5.0, rounds=2, sleep=slept.append)
    assert slept == [5.0] and witness.last == log.sth
    log.append(b"\x0a" * 32)
    run(witness, url, 5.0, rounds=1)
    assert witness.last == log.sth
    with _client(log, url, [witness.public_key]) as client:
        assert client.update().tree_size == 4


def test_a_cosignature_binds_the_log_key(setup):
    log, witness, url = setup
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    cosig = cosign(key, log.public_key_bytes(), log.sth, 1)
    cosig.verify(log.public_key_bytes(), log.sth)
    from traceless.privacy.translog.cosignature import CosignatureError

    with pytest.raises(CosignatureError):
        cosig.verify(bytes(32), log.sth)
