"""Client and verifier of the transparency log's HTTP API (see traceless_tools/cluster/log_service.py).

Trust comes from a pinned Ed25519 public key: every tree head must carry its signature, every
new tree head must be consistent (RFC 9162 2.1.4) with the last one this client verified, and a
measurement counts as published only with an inclusion proof (2.1.3) against a verified head.

With a `WitnessPolicy` (what clients of the private path use), a tree head counts only with enough
fresh cosignatures from trusted witnesses (cosignature.py), and with a `state_path` the last
verified head is kept on disk (mode 0600) and every later head, in this process or the next, must
be consistent with it: a restart does not let the log show a different history.

A release's leaf_input is its 32-byte combined measurement (`measurement_leaf`).
`verify_log` audits a whole log: all entries, the root, and consistency with a saved state.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from traceless.errors import TracelessError
from traceless.events import emit
from traceless.privacy.translog.cosignature import (
    Cosignature,
    CosignatureError,
    StaleTreeHeadError,
    WitnessPolicy,
    check_cosigned,
)
from traceless.privacy.translog.merkle import (
    InvalidProofError,
    MerkleTree,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)
from traceless.privacy.translog.tree_head import SignedTreeHead, TreeHeadError

API = "/log/v1"


class LogClientError(TracelessError):
    """Base class: the log could not be checked or failed a check."""

    result = "protocol"  # the `log.verified` event's result for this failure


class LogUnavailableError(LogClientError):
    """The log server could not be reached or answered with an HTTP error."""

    result = "unreachable"


class LogProtocolError(LogClientError):
    """A response is not the JSON shape the API defines."""


class TreeHeadSignatureError(LogClientError):
    """A tree head's signature does not verify under the pinned key."""

    result = "bad_signature"


class PublicKeyMismatchError(LogClientError):
    """The pinned key differs from the key saved with the previous tree head."""

    result = "key_mismatch"


class InconsistentLogError(LogClientError):
    """The log's new tree does not extend the one seen before: a rewritten history (fork)."""

    result = "inconsistent"


class WitnessCheckError(LogClientError):
    """The tree head lacks the cosignatures the client's witness policy requires."""

    result = "no_cosignature"


class StaleLogError(LogClientError):
    """The newest trusted witness cosignature of the tree head is older than the policy's bound."""

    result = "stale"


class RootMismatchError(LogClientError):
    """The log's entries do not hash to the root its tree head signs."""

    result = "root_mismatch"


class InclusionProofError(LogClientError):
    """An inclusion proof is missing (leaf not in the log) or does not verify."""

    result = "bad_proof"


def measurement_leaf(combined_measurement: bytes) -> bytes:
    """The leaf_input under which a release's combined measurement is logged."""
    if len(combined_measurement) != 32:
        raise ValueError("a combined measurement is 32 bytes")
    return combined_measurement


def _b64(value: object) -> bytes:
    try:
        return base64.b64decode(value, validate=True)  # type: ignore[arg-type]
    except (TypeError, ValueError, binascii.Error):
        raise LogProtocolError("a field is not base64") from None


@dataclass(frozen=True, slots=True)
class LogState:
    """What a verifier remembers of a log: its pinned key and the last tree head it verified."""

    public_key: bytes  # raw Ed25519
    sth: SignedTreeHead

    def to_json(self) -> dict[str, object]:
        return {"public_key": base64.b64encode(self.public_key).decode(), "sth": self.sth.to_json()}

    @classmethod
    def load(cls, path: Path) -> LogState | None:
        """The saved state, or None if the file does not exist (first use)."""
        try:
            obj = json.loads(path.read_text())
            key, sth = _b64(obj["public_key"]), SignedTreeHead.from_json(obj["sth"])
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError, LogProtocolError, TreeHeadError):
            raise LogProtocolError("state file is not a saved log state") from None
        if len(key) != 32:
            raise LogProtocolError("state file public key is not 32 bytes")
        return cls(key, sth)

    def save(self, path: Path) -> None:
        write_private(path, json.dumps(self.to_json(), indent=1).encode())


def write_private(path: Path, data: bytes) -> None:
    """Atomically replace `path` with `data`, mode 0600 whatever the umask."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fetch_public_key(url: str, http: httpx.Client | None = None) -> bytes:
    """The key a log advertises. Trust on first use only: pin it, compare out of band."""
    with LogClient(url, None, http=http) as client:
        return client.advertised_public_key()


class LogClient:
    """Fetches and verifies tree heads and proofs; remembers the last verified tree head."""

    def __init__(
        self,
        url: str,
        public_key: bytes | None,
        *,
        last_sth: SignedTreeHead | None = None,
        http: httpx.Client | None = None,
        timeout: float = 10.0,
        witness: WitnessPolicy | None = None,
        state_path: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = Ed25519PublicKey.from_public_bytes(public_key) if public_key is not None else None
        self._raw_key = public_key
        self._witness = witness
        self._state_path = state_path
        self._clock = clock
        if state_path is not None and last_sth is None:
            state = LogState.load(state_path)
            if state is not None and state.public_key != public_key:
                raise PublicKeyMismatchError("the pinned log key differs from the one saved with the last tree head")
            last_sth = state.sth if state is not None else None
        self._owns_http = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout)
        self._base = url.rstrip("/") + API
        self.last_sth = last_sth

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> LogClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str, **params: str | int) -> dict:
        try:
            response = self._http.get(self._base + path, params=params)
        except httpx.HTTPError as e:
            raise LogUnavailableError(f"log server unreachable ({type(e).__name__})") from None
        if response.status_code == 404 and path == "/proof/inclusion":
            raise InclusionProofError("leaf is not in the log")
        if response.status_code != 200:
            raise LogUnavailableError(f"log server answered HTTP {response.status_code} for {path}")
        try:
            body = response.json()
        except ValueError:
            raise LogProtocolError(f"{path} did not return JSON") from None
        if not isinstance(body, dict):
            raise LogProtocolError(f"{path} did not return a JSON object")
        return body

    def advertised_public_key(self) -> bytes:
        """The raw key the log serves (for pinning on first use; trust comes from the pin)."""
        key = _b64(self._get("/public-key").get("public_key"))
        if len(key) != 32:
            raise LogProtocolError("public key is not 32 bytes")
        return key

    def get_sth(self) -> SignedTreeHead:
        """The log's current tree head, signature verified, and with a witness policy its
        cosignatures too (consistency is not checked here)."""
        if self._key is None or self._raw_key is None:
            raise PublicKeyMismatchError("no public key pinned for this log")
        cosignatures: list[Cosignature] = []
        try:
            if self._witness is None:
                sth = SignedTreeHead.from_json(self._get("/sth"))
            else:
                body = self._get("/sth/cosigned")
                sth = SignedTreeHead.from_json(body.get("sth"))
                cosignatures = [Cosignature.from_json(c) for c in _list(body, "cosignatures")]
        except (TreeHeadError, CosignatureError):
            raise LogProtocolError("tree head or cosignature is malformed") from None
        try:
            sth.verify(self._key)
        except TreeHeadError:
            raise TreeHeadSignatureError("tree head signature does not verify") from None
        if self._witness is not None:
            try:
                check_cosigned(self._witness, self._raw_key, sth, cosignatures, int(self._clock() * 1000))
            except StaleTreeHeadError as e:
                raise StaleLogError(str(e)) from None
            except CosignatureError as e:
                raise WitnessCheckError(str(e)) from None
        return sth

    def check_consistency(self, old: SignedTreeHead, new: SignedTreeHead) -> None:
        """Raise InconsistentLogError unless `new` extends `old` (proof fetched from the log)."""
        if new.tree_size < old.tree_size or new.timestamp < old.timestamp:
            raise InconsistentLogError("the log went back: smaller tree or older timestamp")
        if old.tree_size == 0:
            return  # every tree extends the empty tree
        if new.tree_size == old.tree_size:
            proof: list[bytes] = []
        else:
            body = self._get("/proof/consistency", first=old.tree_size, second=new.tree_size)
            proof = [_b64(p) for p in _list(body, "consistency_path")]
        try:
            verify_consistency(old.tree_size, new.tree_size, proof, old.root_hash, new.root_hash)
        except InvalidProofError:
            raise InconsistentLogError(
                f"tree of size {new.tree_size} does not extend the tree of size {old.tree_size} seen before"
            ) from None

    def update(self) -> SignedTreeHead:
        """Fetch the current tree head, check it against the last one seen, and remember it."""
        sth = self.get_sth()
        if self.last_sth is not None:
            self.check_consistency(self.last_sth, sth)
        if self._state_path is not None and sth != self.last_sth:
            LogState(self._raw_key or b"", sth).save(self._state_path)
        self.last_sth = sth
        return sth

    def prove_inclusion(self, leaf_hash_: bytes, sth: SignedTreeHead | None = None) -> int:
        """Verify that the leaf is in the tree `sth` (default: a freshly updated head); its index."""
        sth = sth if sth is not None else self.update()
        if sth.tree_size == 0:
            raise InclusionProofError("leaf is not in the log")
        body = self._get("/proof/inclusion", leaf_hash=base64.b64encode(leaf_hash_).decode(), tree_size=sth.tree_size)
        index = body.get("leaf_index")
        if type(index) is not int or body.get("tree_size") != sth.tree_size:
            raise LogProtocolError("inclusion proof response is malformed")
        path = [_b64(p) for p in _list(body, "inclusion_path")]
        try:
            verify_inclusion(leaf_hash_, index, sth.tree_size, path, sth.root_hash)
        except InvalidProofError:
            raise InclusionProofError("inclusion proof does not verify") from None
        return index

    def get_entries(self, tree_size: int) -> list[bytes]:
        """All leaf_inputs of a tree of `tree_size`, fetched page by page."""
        entries: list[bytes] = []
        while len(entries) < tree_size:
            body = self._get("/entries", start=len(entries), end=tree_size - 1)
            page = [_b64(e.get("leaf_input") if isinstance(e, dict) else None) for e in _list(body, "entries")]
            if not page or len(entries) + len(page) > tree_size:
                raise LogProtocolError("entries page is empty or too long")
            entries.extend(page)
        return entries


def _list(body: dict, key: str) -> list:
    value = body.get(key)
    if not isinstance(value, list):
        raise LogProtocolError(f"'{key}' is not a list")
    return value


@dataclass(frozen=True, slots=True)
class LogVerification:
    sth: SignedTreeHead
    previous_size: int | None  # tree size of the saved state checked against, None on first use
    public_key: bytes


def verify_log(
    url: str, state_file: str | Path | None, public_key: bytes | None = None, *, http: httpx.Client | None = None
) -> LogVerification:
    """Audit the whole log at `url` and, if it passes, save its tree head to `state_file`.

    Key: `public_key` if given (must match the saved one), else the saved one, else the key the
    log advertises (trust on first use). Checks: STH signature; consistency proof from the saved
    head; all entries hash to the signed root and their prefix to the saved root.
    """
    path = Path(state_file) if state_file is not None else None
    try:
        result = _verify_log(url, path, public_key, http)
    except LogClientError as e:
        emit("log.verified", result=e.result, tree_size=0)
        raise
    emit("log.verified", result="ok", tree_size=result.sth.tree_size)
    return result


def _verify_log(url: str, path: Path | None, public_key: bytes | None, http: httpx.Client | None) -> LogVerification:
    state = LogState.load(path) if path is not None else None
    if state is not None and public_key is not None and state.public_key != public_key:
        raise PublicKeyMismatchError("the given public key differs from the one saved in the state file")
    key = public_key or (state.public_key if state else None) or fetch_public_key(url, http)
    old = state.sth if state is not None else None
    with LogClient(url, key, last_sth=old, http=http) as client:
        sth = client.update()
        entries = client.get_entries(sth.tree_size)
        tree = MerkleTree([leaf_hash(e) for e in entries])
        if tree.root() != sth.root_hash:
            raise RootMismatchError("the log's entries do not hash to its signed root")
        if old is not None and tree.root(old.tree_size) != old.root_hash:
            raise InconsistentLogError("the log's entries rewrite the history seen before")
        if entries:
            client.prove_inclusion(leaf_hash(entries[-1]), sth)
    if path is not None:
        LogState(key, sth).save(path)
    return LogVerification(sth, old.tree_size if old is not None else None, key)
