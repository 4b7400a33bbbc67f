"""The log's HTTP service over real loopback HTTP: every endpoint, proofs verified client-side."""

import base64
import json

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.support.log_service import running_log_service
from traceless.privacy.translog.log import TransparencyLog
from traceless.privacy.translog.merkle import leaf_hash, merkle_tree_hash, verify_consistency, verify_inclusion
from traceless.privacy.translog.tree_head import SignedTreeHead
from traceless_tools.cluster import log_service

LEAVES = [f"release-{i}".encode() for i in range(6)]


@pytest.fixture
def served(tmp_path, log_service):
    """A log of LEAVES that the test may change."""
    log = TransparencyLog.create(tmp_path / "log")
    log.append_batch(LEAVES)
    url = log_service(tmp_path / "log")
    with httpx.Client(base_url=url + "/log/v1", timeout=10) as http:
        yield log, http


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One served log of LEAVES for the tests that only read."""
    directory = tmp_path_factory.mktemp("shared") / "log"
    log = TransparencyLog.create(directory)
    log.append_batch(LEAVES)
    with running_log_service(directory) as url, httpx.Client(base_url=url + "/log/v1", timeout=10) as http:
        yield log, http


def _b64(s):
    return base64.b64decode(s)


def test_sth_and_public_key(shared):
    log, http = shared
    key = http.get("/public-key").json()
    assert _b64(key["public_key"]) == log.public_key_bytes()
    body = http.get("/sth").json()
    assert set(body) == {"tree_size", "timestamp", "root_hash", "signature"}
    sth = SignedTreeHead.from_json(body)
    assert sth.tree_size == 6 and sth.root_hash == merkle_tree_hash(LEAVES)
    sth.verify(Ed25519PublicKey.from_public_bytes(_b64(key["public_key"])))


@pytest.mark.parametrize("encoding", ["b64", "hex", "urlsafe"])
def test_inclusion_proofs_verify(shared, encoding):
    _, http = shared
    for size in (3, 6):
        root = merkle_tree_hash(LEAVES[:size])
        for i in range(size):
            h = leaf_hash(LEAVES[i])
            given = {
                "b64": base64.b64encode(h).decode(),
                "hex": h.hex(),
                "urlsafe": base64.urlsafe_b64encode(h).decode(),
            }[encoding]
            body = http.get("/proof/inclusion", params={"leaf_hash": given, "tree_size": size}).json()
            assert body["leaf_index"] == i and body["tree_size"] == size
            verify_inclusion(h, i, size, [_b64(p) for p in body["inclusion_path"]], root)


def test_consistency_proofs_verify(shared):
    _, http = shared
    for first in range(1, 7):
        body = http.get("/proof/consistency", params={"first": first, "second": 6}).json()
        verify_consistency(
            first,
            6,
            [_b64(p) for p in body["consistency_path"]],
            merkle_tree_hash(LEAVES[:first]),
            merkle_tree_hash(LEAVES),
        )


def test_entries_inclusive_and_capped(shared, monkeypatch):
    _, http = shared
    body = http.get("/entries", params={"start": 1, "end": 3}).json()
    assert [_b64(e["leaf_input"]) for e in body["entries"]] == LEAVES[1:4]
    body = http.get("/entries", params={"start": 4, "end": 100}).json()  # clipped to the tree
    assert [_b64(e["leaf_input"]) for e in body["entries"]] == LEAVES[4:]
    monkeypatch.setattr(log_service, "MAX_ENTRIES_PER_REQUEST", 2)
    body = http.get("/entries", params={"start": 0, "end": 5}).json()
    assert [_b64(e["leaf_input"]) for e in body["entries"]] == LEAVES[:2]


def test_appends_by_another_process_are_served(served, tmp_path):
    _, http = served
    TransparencyLog.open(tmp_path / "log").append(b"release-6")
    assert http.get("/sth").json()["tree_size"] == 7
    h = base64.b64encode(leaf_hash(b"release-6")).decode()
    assert http.get("/proof/inclusion", params={"leaf_hash": h, "tree_size": 7}).json()["leaf_index"] == 6


SECRETISH = "zz-do-not-echo-zz"


@pytest.mark.parametrize(
    "path, params",
    [
        ("/proof/inclusion", {"tree_size": 6}),
        ("/proof/inclusion", {"leaf_hash": SECRETISH, "tree_size": 6}),
        ("/proof/inclusion", {"leaf_hash": base64.b64encode(b"x" * 31).decode(), "tree_size": 6}),
        ("/proof/inclusion", {"leaf_hash": "00" * 32, "tree_size": 0}),
        ("/proof/inclusion", {"leaf_hash": "00" * 32, "tree_size": 7}),
        ("/proof/inclusion", {"leaf_hash": "00" * 32, "tree_size": SECRETISH}),
        ("/proof/consistency", {"first": 0, "second": 3}),
        ("/proof/consistency", {"first": 4, "second": 3}),
        ("/proof/consistency", {"first": 1, "second": 7}),
        ("/proof/consistency", {"first": "-1", "second": 3}),
        ("/proof/consistency", {"first": 1}),
        ("/entries", {"start": 3, "end": 2}),
        ("/entries", {"start": 6, "end": 6}),
        ("/entries", {"start": "1e3", "end": 2}),
        ("/entries", {"start": str(2**63), "end": str(2**63)}),
    ],
)
def test_bad_parameters_are_400_json(shared, path, params):
    _, http = shared
    response = http.get(path, params=params)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert SECRETISH not in response.text


def test_unknown_leaf_is_404_and_unknown_route_is_json(shared):
    _, http = shared
    response = http.get("/proof/inclusion", params={"leaf_hash": "ab" * 32, "tree_size": 6})
    assert response.status_code == 404 and response.json()["error"]["code"] == "leaf_not_found"
    response = http.get(
        "/proof/inclusion",  # in the log, but not in the tree of size 2
        params={"leaf_hash": leaf_hash(LEAVES[4]).hex(), "tree_size": 2},
    )
    assert response.status_code == 404
    response = http.get("/append")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    response = http.post("/sth")
    assert response.status_code == 405 and "error" in response.json()


def test_corrupted_directory_is_503(served, tmp_path):
    _, http = served
    sth = tmp_path / "log" / "sth.json"
    head = json.loads(sth.read_text())
    head["tree_size"] = 5
    sth.write_text(json.dumps(head))
    response = http.get("/sth")
    assert response.status_code == 503 and response.json()["error"]["code"] == "log_unavailable"


def test_events_only(shared, captured_events):
    _, http = shared
    http.get("/sth")
    http.get("/proof/inclusion", params={"leaf_hash": SECRETISH, "tree_size": 6})
    records = captured_events()
    assert {r["event"] for r in records} == {"http.request", "http.error"}
    assert all(r.get("component") == "log" for r in records)
    assert SECRETISH not in captured_events.text()
