"""The log client and `verify_log` against the real service: forks, rollbacks, forged answers."""

import base64

import httpx
import pytest

from tests.support.log_service import rewrite_history
from traceless.privacy.translog import log as tl
from traceless.privacy.translog.client import (
    InclusionProofError,
    InconsistentLogError,
    LogClient,
    LogState,
    LogUnavailableError,
    PublicKeyMismatchError,
    RootMismatchError,
    TreeHeadSignatureError,
    measurement_leaf,
    verify_log,
)
from traceless.privacy.translog.log import TransparencyLog
from traceless.privacy.translog.merkle import leaf_hash

RELEASES = [bytes([i]) * 32 for i in range(1, 6)]


@pytest.fixture
def setup(tmp_path, log_service):
    log = TransparencyLog.create(tmp_path / "log")
    log.append_batch(RELEASES[:3])
    return log, log_service(tmp_path / "log"), tmp_path / "state.json"


def test_first_use_then_growth(setup):
    log, url, state = setup
    first = verify_log(url, state)
    assert first.previous_size is None and first.sth.tree_size == 3
    assert first.public_key == log.public_key_bytes()
    saved = LogState.load(state)
    assert saved.sth == first.sth and saved.public_key == log.public_key_bytes()
    log.append_batch(RELEASES[3:])
    second = verify_log(url, state, public_key=log.public_key_bytes())
    assert second.previous_size == 3 and second.sth.tree_size == 5
    assert verify_log(url, state).previous_size == 5  # unchanged log: still fine


@pytest.mark.parametrize(
    "forked",
    [
        [RELEASES[0], b"\xee" * 32, RELEASES[2], RELEASES[3]],  # bigger tree, different past
        [RELEASES[0], RELEASES[1], b"\xee" * 32],  # same size, different root
    ],
)
def test_fork_is_detected_against_saved_state(setup, tmp_path, forked):
    _, url, state = setup
    verify_log(url, state)
    saved = state.read_text()
    rewrite_history(tmp_path / "log", forked)
    TransparencyLog.open(tmp_path / "log")  # the forked directory is itself a valid log
    with pytest.raises(InconsistentLogError):
        verify_log(url, state)
    assert state.read_text() == saved  # a failed check never moves the saved head
    verify_log(url, tmp_path / "fresh.json")  # a verifier with no history cannot tell


def test_new_log_at_same_directory_fails_the_pinned_key(setup, tmp_path):
    _, url, state = setup
    verify_log(url, state)
    for name in (tl.ENTRIES, tl.STH, tl.SIGNING_KEY, tl.PUBLIC_KEY):
        (tmp_path / "log" / name).unlink()
    TransparencyLog.create(tmp_path / "log").append_batch(RELEASES)
    with pytest.raises(TreeHeadSignatureError):
        verify_log(url, state)


def test_given_key_must_match_saved_key(setup):
    log, url, state = setup
    verify_log(url, state)
    with pytest.raises(PublicKeyMismatchError):
        verify_log(url, state, public_key=b"\x01" * 32)


@pytest.fixture
def tampering():
    """tampering(mutate) -> an httpx client that forwards to the real service and lets
    `mutate(path, json_body)` edit the answers (a man in the middle or a lying log)."""
    upstream = httpx.Client(timeout=10)
    made = []

    def make(mutate):
        def handler(request):
            real = upstream.get(str(request.url))
            return httpx.Response(real.status_code, json=mutate(request.url.path, real.json()))

        made.append(httpx.Client(transport=httpx.MockTransport(handler)))
        return made[-1]

    yield make
    for client in made + [upstream]:
        client.close()


def _flip_b64(value):
    raw = bytearray(base64.b64decode(value))
    raw[0] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def test_forged_answers_are_caught(setup, tampering):
    _, url, state = setup

    def bad_signature(path, body):
        return {**body, "signature": _flip_b64(body["signature"])} if path.endswith("/sth") else body

    def bad_entry(path, body):
        if path.endswith("/entries"):
            body["entries"][0]["leaf_input"] = base64.b64encode(b"forged").decode()
        return body

    with pytest.raises(TreeHeadSignatureError):
        verify_log(url, state, http=tampering(bad_signature))
    with pytest.raises(RootMismatchError):
        verify_log(url, state, http=tampering(bad_entry))
    assert not state.exists()


def test_rollback_to_an_older_head_is_caught(setup, tampering):
    log, url, state = setup
    old_head = log.sth.to_json()
    log.append(RELEASES[3])
    verify_log(url, state)
    replay = tampering(lambda path, body: old_head if path.endswith("/sth") else body)
    with pytest.raises(InconsistentLogError):
        verify_log(url, state, http=replay)


def test_client_inclusion_and_update(setup, tampering):
    log, url, _ = setup
    with LogClient(url, log.public_key_bytes()) as client:
        sth = client.update()
        assert client.prove_inclusion(leaf_hash(measurement_leaf(RELEASES[1]))) == 1
        with pytest.raises(InclusionProofError):  # not published
            client.prove_inclusion(leaf_hash(RELEASES[4]), sth)
        log.append(RELEASES[4])
        assert client.prove_inclusion(leaf_hash(RELEASES[4])) == 3
        assert client.last_sth.tree_size == 4

    def bad_path(path, body):
        if path.endswith("/proof/inclusion"):
            body["inclusion_path"][0] = _flip_b64(body["inclusion_path"][0])
        return body

    with LogClient(url, log.public_key_bytes(), http=tampering(bad_path)) as client:
        with pytest.raises(InclusionProofError):
            client.prove_inclusion(leaf_hash(RELEASES[0]))


def test_unreachable_log(tmp_path):
    with pytest.raises(LogUnavailableError):
        verify_log("http://127.0.0.1:9", tmp_path / "state.json", public_key=b"\x02" * 32)
