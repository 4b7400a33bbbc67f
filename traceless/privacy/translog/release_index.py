"""Which logged release a node's attested measurement belongs to.

`ReleaseLookup` is the one question the gateway (admission) and the client (verification) ask of
the transparency log: the release manifest whose `combined` measurement equals the one a node
attests, or a typed error. `ReleaseIndex` answers it from a `LogClient`: it takes a signed tree
head (consistent with every head seen before), fetches the whole tree's entries, checks that they
hash to that head's root (so every manifest it returns is proven to be in the log) and indexes the
release manifests among them by `combined`, and the issuer key entries by issuer name (for the
client's token wallet: it uses only logged issuer keys). Other leaves (legacy bare measurement
hashes) are skipped. A miss refreshes the head once at most every `refresh_s`, so a release or an
issuer key logged after start is found without a restart. Thread-safe (the client asks from worker
threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from traceless.errors import TracelessError
from traceless.privacy.translog.client import LogClient, LogClientError, LogProtocolError
from traceless.privacy.translog.manifest import IssuerKeyEntry, ManifestError, ReleaseManifest, decode_leaf
from traceless.privacy.translog.merkle import merkle_tree_hash


class ReleaseNotLoggedError(TracelessError):
    """No release manifest in the log has this combined measurement."""


class ReleaseLookup(Protocol):
    def release_for(self, combined: bytes) -> ReleaseManifest:
        """The logged release whose combined measurement is `combined`; ReleaseNotLoggedError
        (or a LogClientError when the log cannot be read or does not verify) otherwise."""
        ...


class ReleaseIndex:
    """ReleaseLookup over a LogClient (see the module docstring)."""

    def __init__(self, log: LogClient, refresh_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self._log = log
        self._refresh_s = refresh_s
        self._clock = clock
        self._releases: dict[bytes, ReleaseManifest] = {}
        self._issuer_keys: dict[str, list[IssuerKeyEntry]] = {}
        self._size = -1
        self._refreshed_at: float | None = None
        self._lock = threading.Lock()
        self._failure: LogClientError | None = None  # why the last refresh failed, if it did

    def _refresh_if_due(self) -> None:
        """Refresh unless one was tried within refresh_s; if that one failed, its error again (a miss
        then says why the log could not be checked, not that the entry is absent). A refresh that
        another thread (the token wallet's schedule) has under way is waited for, not skipped."""
        with self._lock:
            if self._refreshed_at is None or self._clock() - self._refreshed_at >= self._refresh_s:
                self._refresh_locked()
            elif self._failure is not None:
                raise self._failure

    def release_for(self, combined: bytes) -> ReleaseManifest:
        manifest = self._releases.get(combined)
        if manifest is None:
            self._refresh_if_due()
            manifest = self._releases.get(combined)
        if manifest is None:
            raise ReleaseNotLoggedError("no logged release has the attested measurement")
        return manifest

    def issuer_keys(self, issuer: str, *, refresh: bool = False) -> list[IssuerKeyEntry]:
        """The logged key entries of `issuer`, in log order (none known yet, or `refresh`: the head is
        taken again, at most once every `refresh_s`)."""
        if refresh or issuer not in self._issuer_keys:
            self._refresh_if_due()
        return list(self._issuer_keys.get(issuer, ()))

    def refresh(self) -> None:
        """Take the log's current head (consistency-checked) and index any new entries."""
        with self._lock:
            self._refresh_locked()

    def _refresh_locked(self) -> None:
        self._refreshed_at = self._clock()
        try:
            self._index_current()
        except LogClientError as exc:
            self._failure = exc
            raise
        self._failure = None

    def _index_current(self) -> None:
        sth = self._log.update()
        if sth.tree_size == self._size:
            return
        leaves = self._log.get_entries(sth.tree_size)
        if merkle_tree_hash(leaves) != sth.root_hash:
            raise LogProtocolError("the log's entries do not hash to its signed tree head")
        releases: dict[bytes, ReleaseManifest] = {}
        issuer_keys: dict[str, list[IssuerKeyEntry]] = {}
        for leaf in leaves:
            try:
                entry = decode_leaf(leaf)
            except ManifestError:
                continue  # not a readable entry (a legacy bare measurement hash): nothing to use
            if isinstance(entry, ReleaseManifest):
                releases[entry.combined] = entry
            else:
                issuer_keys.setdefault(entry.issuer, []).append(entry)
        self._releases, self._issuer_keys, self._size = releases, issuer_keys, sth.tree_size
