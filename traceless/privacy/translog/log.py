"""Append-only transparency log of release measurements, kept in one directory (RFC 9162 style).

Directory layout:

    entries.bin      MAGIC, then one record per leaf:
                       uint32be(len(leaf_input)) || leaf_input || SHA-256(0x00 || leaf_input)
                     (the trailing leaf hash doubles as the record's checksum)
    sth.json         the latest signed tree head {"tree_size", "timestamp", "root_hash", "signature"}
    signing-key.pem  the log operator's Ed25519 key (PKCS#8 PEM, mode 0600; not user data)
    public-key.pem   its public key (SubjectPublicKeyInfo PEM), all a reader needs
    lock             flock()ed by appenders

sth.json is the published state: the log holds exactly its `tree_size` leaves. An append writes
and fsyncs the record first, then signs the new tree head and atomically replaces sth.json, so a
crash leaves at most an unsigned tail after the published records; readers ignore it and the next
append truncates it. Opening checks every published record, the root and the STH signature, and
refuses a directory that fails any check (`LogCorruptError`, `LogTruncatedError`).

Tree heads are signed with the operator's Ed25519 key as `tree_head.py` defines.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from traceless.errors import TracelessError
from traceless.events import emit
from traceless.privacy.translog.merkle import EMPTY_ROOT, HASH_SIZE, MerkleTree, TreeSizeError, leaf_hash
from traceless.privacy.translog.tree_head import SignedTreeHead, TreeHeadError, sign_tree_head

MAGIC = b"TLSLOG1\n"
MAX_LEAF_SIZE = 64 * 1024
ENTRIES, STH, SIGNING_KEY, PUBLIC_KEY, LOCK = ("entries.bin", "sth.json", "signing-key.pem", "public-key.pem", "lock")


class TransparencyLogError(TracelessError):
    """Base class of transparency log errors."""


class LogNotFoundError(TransparencyLogError, FileNotFoundError):
    """The directory holds no log."""


class LogExistsError(TransparencyLogError, FileExistsError):
    """A log was to be created where one (or part of one) already exists."""


class LogCorruptError(TransparencyLogError):
    """The log directory fails validation: bad header, checksum, root or signature."""


class LogTruncatedError(LogCorruptError):
    """entries.bin holds fewer records than the signed tree head covers."""


class InsecureKeyFileError(TransparencyLogError):
    """The signing key file is readable or writable by group or others."""


class LeafTooLargeError(TransparencyLogError, ValueError):
    """A leaf_input is larger than MAX_LEAF_SIZE."""


class DuplicateLeafError(TransparencyLogError, ValueError):
    """The leaf is already in the log (a leaf hash names exactly one entry)."""


class LeafNotFoundError(TransparencyLogError, LookupError):
    """No leaf with this hash in the requested tree."""


@dataclass(frozen=True, slots=True)
class InclusionProof:
    leaf_index: int
    tree_size: int
    inclusion_path: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class AppendResult:
    leaf_index: int
    leaf_hash: bytes
    sth: SignedTreeHead


@dataclass(slots=True)
class _Snapshot:
    """What the log holds as of one version of sth.json (`raw_sth`, its exact bytes)."""

    sth: SignedTreeHead
    public_key: Ed25519PublicKey
    leaf_inputs: list[bytes]
    tree: MerkleTree
    index: dict[bytes, int]  # leaf hash -> leaf index
    published_end: int  # byte offset in entries.bin just past the last published record
    raw_sth: bytes


def _parse_records(data: bytes, count: int) -> tuple[list[bytes], list[bytes], int]:
    if data[: len(MAGIC)] != MAGIC:
        raise LogCorruptError("entries file has no log header")
    leaves, hashes, off = [], [], len(MAGIC)
    for _ in range(count):
        if off + 4 > len(data):
            raise LogTruncatedError("entries file ends before the signed tree size")
        n = int.from_bytes(data[off : off + 4], "big")
        if n > MAX_LEAF_SIZE:
            raise LogCorruptError("record length exceeds the leaf size limit")
        end = off + 4 + n + HASH_SIZE
        if end > len(data):
            raise LogTruncatedError("entries file ends inside a signed record")
        leaf = data[off + 4 : off + 4 + n]
        h = leaf_hash(leaf)
        if h != data[off + 4 + n : end]:
            raise LogCorruptError("record checksum mismatch")
        leaves.append(leaf)
        hashes.append(h)
        off = end
    return leaves, hashes, off


def _load(directory: Path) -> _Snapshot:
    try:
        public_key = serialization.load_pem_public_key((directory / PUBLIC_KEY).read_bytes())
        raw_sth = (directory / STH).read_bytes()
        data = (directory / ENTRIES).read_bytes()
    except FileNotFoundError:
        raise LogCorruptError("log directory is missing a file") from None
    except ValueError:
        raise LogCorruptError("public key file is not a PEM public key") from None
    if not isinstance(public_key, Ed25519PublicKey):
        raise LogCorruptError("public key is not Ed25519")
    try:
        sth = SignedTreeHead.from_json(json.loads(raw_sth))
        sth.verify(public_key)
    except (ValueError, TreeHeadError) as e:
        raise LogCorruptError(f"signed tree head rejected: {e}") from None
    leaves, hashes, end = _parse_records(data, sth.tree_size)
    tree = MerkleTree(hashes)
    if tree.root() != sth.root_hash:
        raise LogCorruptError("entries do not hash to the signed root")
    index: dict[bytes, int] = {}
    for i, h in enumerate(hashes):
        index.setdefault(h, i)
    return _Snapshot(sth, public_key, leaves, tree, index, end, raw_sth)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)  # independent of the umask
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    _write_new(tmp, data, 0o644)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TransparencyLog:
    """A log directory opened for reading; `append` also writes (needs the signing key).

    A reader in another process sees appends after `refresh()`, which reloads when sth.json
    changed. Not thread-safe: use from one thread (the HTTP service uses its event loop).
    """

    def __init__(self, directory: Path, snapshot: _Snapshot) -> None:
        self._dir = directory
        self._snap: _Snapshot | None = snapshot

    @classmethod
    def create(cls, directory: str | os.PathLike[str]) -> TransparencyLog:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        if any((d / name).exists() for name in (ENTRIES, STH, SIGNING_KEY, PUBLIC_KEY)):
            raise LogExistsError("directory already holds (part of) a log")
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _write_new(d / SIGNING_KEY, pem, 0o600)
        _write_new(
            d / PUBLIC_KEY,
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
            0o644,
        )
        _write_new(d / ENTRIES, MAGIC, 0o644)
        _replace(d / STH, json.dumps(sign_tree_head(key, 0, _now_ms(), EMPTY_ROOT).to_json()).encode())
        return cls.open(d)

    @classmethod
    def open(cls, directory: str | os.PathLike[str]) -> TransparencyLog:
        d = Path(directory)
        if not any((d / name).exists() for name in (ENTRIES, STH, PUBLIC_KEY)):
            raise LogNotFoundError("no transparency log in this directory")
        log = cls(d, _load(d))
        emit("log.opened", tree_size=log.tree_size)
        return log

    @classmethod
    def open_or_create(cls, directory: str | os.PathLike[str]) -> TransparencyLog:
        try:
            return cls.open(directory)
        except LogNotFoundError:
            return cls.create(directory)

    # -- reading -------------------------------------------------------------------------------
    def _snapshot(self) -> _Snapshot:
        if self._snap is None:  # a failed append left memory unsure: reload from disk
            self._snap = _load(self._dir)
        return self._snap

    def refresh(self) -> bool:
        """Reload if sth.json changed on disk (another process appended); True if it did.

        Compares the file's bytes, not its stat: a few hundred bytes per call, and immune to
        coarse mtimes and reused inode numbers.
        """
        try:
            raw_sth = (self._dir / STH).read_bytes()
        except FileNotFoundError:
            raise LogCorruptError("log directory is missing a file") from None
        if self._snap is not None and raw_sth == self._snap.raw_sth:
            return False
        self._snap = None
        self._snap = _load(self._dir)
        return True

    @property
    def sth(self) -> SignedTreeHead:
        return self._snapshot().sth

    @property
    def tree_size(self) -> int:
        return self._snapshot().sth.tree_size

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self._snapshot().public_key

    def public_key_bytes(self) -> bytes:
        return self.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def leaf_index(self, leaf_hash_: bytes) -> int | None:
        return self._snapshot().index.get(leaf_hash_)

    def inclusion_proof(self, leaf_hash_: bytes, tree_size: int | None = None) -> InclusionProof:
        snap = self._snapshot()
        size = snap.sth.tree_size if tree_size is None else tree_size
        if not 1 <= size <= snap.sth.tree_size:
            raise TreeSizeError(f"tree size must be in 1..{snap.sth.tree_size}")
        index = snap.index.get(leaf_hash_)
        if index is None or index >= size:
            raise LeafNotFoundError("no such leaf in the requested tree")
        return InclusionProof(index, size, tuple(snap.tree.inclusion_proof(index, size)))

    def consistency_proof(self, first: int, second: int) -> list[bytes]:
        snap = self._snapshot()
        if second > snap.sth.tree_size:
            raise TreeSizeError(f"second must be at most {snap.sth.tree_size}")
        return snap.tree.consistency_proof(first, second)

    def get_entries(self, start: int, end: int) -> list[bytes]:
        """leaf_inputs start..end, both inclusive (RFC 6962 get-entries)."""
        snap = self._snapshot()
        if not 0 <= start <= end < snap.sth.tree_size:
            raise TreeSizeError(f"need 0 <= start <= end < {snap.sth.tree_size}")
        return snap.leaf_inputs[start : end + 1]

    # -- appending -----------------------------------------------------------------------------
    @contextmanager
    def _writer_lock(self) -> Iterator[None]:
        fd = os.open(self._dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _signing_key(self) -> Ed25519PrivateKey:
        path = self._dir / SIGNING_KEY
        if os.stat(path).st_mode & 0o077:
            raise InsecureKeyFileError("signing key file must be mode 0600")
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise LogCorruptError("signing key is not Ed25519")
        if key.public_key() != self.public_key:
            raise LogCorruptError("signing key does not match the public key")
        return key

    def append(self, leaf_input: bytes) -> AppendResult:
        """Add one leaf and publish the new signed tree head."""
        return self.append_batch([leaf_input])[0]

    def append_batch(self, leaf_inputs: Sequence[bytes]) -> list[AppendResult]:
        """Add leaves in order and publish one signed tree head covering all of them.

        Raises DuplicateLeafError if a leaf is already in the log (or repeated in the batch).
        """
        if any(len(leaf) > MAX_LEAF_SIZE for leaf in leaf_inputs):
            raise LeafTooLargeError(f"leaf_input larger than {MAX_LEAF_SIZE} bytes")
        hashes = [leaf_hash(leaf) for leaf in leaf_inputs]
        if not hashes:
            raise ValueError("append_batch needs at least one leaf")
        if len(set(hashes)) != len(hashes):
            raise DuplicateLeafError("the batch repeats a leaf")
        with self._writer_lock():
            self.refresh()
            key, snap = self._signing_key(), self._snapshot()
            first = snap.sth.tree_size
            for h in hashes:
                if h in snap.index:
                    raise DuplicateLeafError(f"leaf already in the log at index {snap.index[h]}")
            # Until the new head is published, memory is unsure: if anything below raises,
            # _snap stays None and the next read reloads from disk.
            self._snap = None
            end = self._write_records(snap.published_end, leaf_inputs, hashes)
            for i, (leaf, h) in enumerate(zip(leaf_inputs, hashes)):
                snap.tree.append(h)
                snap.leaf_inputs.append(leaf)
                snap.index[h] = first + i
            ts = max(_now_ms(), snap.sth.timestamp)  # tree head timestamps never go back
            sth = sign_tree_head(key, snap.tree.size, ts, snap.tree.root())
            raw_sth = json.dumps(sth.to_json()).encode()
            _replace(self._dir / STH, raw_sth)
            snap.sth, snap.published_end, snap.raw_sth = sth, end, raw_sth
            self._snap = snap
        emit("log.appended", tree_size=sth.tree_size)
        return [AppendResult(first + i, h, sth) for i, h in enumerate(hashes)]

    def _write_records(self, offset: int, leaf_inputs: Sequence[bytes], hashes: list[bytes]) -> int:
        records = b"".join(len(leaf).to_bytes(4, "big") + leaf + h for leaf, h in zip(leaf_inputs, hashes))
        with open(self._dir / ENTRIES, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if size > offset:  # an unsigned tail left by a crashed append: never published
                emit("log.recovered", dropped_bytes=size - offset)
                f.truncate(offset)
            f.seek(offset)
            f.write(records)
            f.flush()
            os.fsync(f.fileno())
        return offset + len(records)
