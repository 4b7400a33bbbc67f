"""ReleaseIndex: releases and issuer keys from one verified view of the log; a failed refresh keeps
saying why (within refresh_s) rather than that an entry is absent."""

import pytest

from traceless.privacy.translog.client import TreeHeadSignatureError
from traceless.privacy.translog.manifest import IssuerKeyEntry, ReleaseManifest
from traceless.privacy.translog.merkle import merkle_tree_hash
from traceless.privacy.translog.release_index import ReleaseIndex, ReleaseNotLoggedError
from traceless.privacy.translog.tree_head import SignedTreeHead

RELEASE = ReleaseManifest(b"\x01" * 32, b"\x02" * 32, {"component": "node"}, (1,))
KEY = IssuerKeyEntry("issuer.test", b"spki", 0, 10)


class FakeLog:
    def __init__(self, leaves):
        self.leaves, self.fail, self.updates = leaves, False, 0

    def update(self):
        self.updates += 1
        if self.fail:
            raise TreeHeadSignatureError("tree head signature does not verify")
        return SignedTreeHead(len(self.leaves), 1, merkle_tree_hash(self.leaves), bytes(64))

    def get_entries(self, n):
        return self.leaves[:n]


class SlowLog(FakeLog):
    """A log whose head takes until `release` is set to read (`started` says the read began)."""

    def __init__(self, started, release, leaves):
        super().__init__(leaves)
        self.started, self.release = started, release

    def update(self):
        self.started.set()
        assert self.release.wait(5)
        return super().update()


def test_releases_and_issuer_keys_come_from_the_same_view():
    log = FakeLog([RELEASE.encode(), KEY.encode(), b"\x42" * 32])
    index = ReleaseIndex(log, refresh_s=30, clock=lambda: 0.0)
    assert index.release_for(RELEASE.combined) == RELEASE
    assert index.issuer_keys("issuer.test") == [KEY] and index.issuer_keys("other") == []
    assert log.updates == 1  # one refresh served all three questions (the miss is within refresh_s)


def test_a_failed_refresh_is_reported_again_not_as_a_miss():
    now = [0.0]
    log = FakeLog([RELEASE.encode()])
    log.fail = True
    index = ReleaseIndex(log, refresh_s=30, clock=lambda: now[0])
    for _ in range(2):  # the second call is within refresh_s: no new fetch, the same reason
        with pytest.raises(TreeHeadSignatureError):
            index.release_for(RELEASE.combined)
    with pytest.raises(TreeHeadSignatureError):
        index.issuer_keys("issuer.test")
    assert log.updates == 1
    log.fail, now[0] = False, 31.0
    assert index.release_for(RELEASE.combined) == RELEASE
    with pytest.raises(ReleaseNotLoggedError):
        index.release_for(b"\x00" * 32)  # within refresh_s of a good refresh: a plain miss


def test_a_lookup_waits_for_a_refresh_another_thread_has_under_way():
    """The token wallet's schedule and the node verifier share one index: a lookup that arrives while
    the wallet's refresh is reading the log must see what that refresh finds, not an empty index."""
    import threading

    started, release = threading.Event(), threading.Event()
    index = ReleaseIndex(SlowLog(started, release, [RELEASE.encode()]))
    worker = threading.Thread(target=index.refresh)
    worker.start()
    assert started.wait(5)
    found: list = []
    lookup = threading.Thread(target=lambda: found.append(index.release_for(RELEASE.combined)))
    lookup.start()
    release.set()
    worker.join(5)
    lookup.join(5)
    assert found == [RELEASE]
