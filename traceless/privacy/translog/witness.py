"""A witness of one transparency log: its own key, and the last tree head it cosigned, on disk.

`Witness.cosign_latest` fetches the log's current tree head (signature checked under the log key
the witness pinned), checks that it extends the last head this witness cosigned (a consistency
proof from the log; for the same size, the same root), records it, and only then cosigns it. A log
that shows a head that does not extend the recorded one (a fork, or history rewritten) gets
`InconsistentLogError` and no cosignature, now and for as long as the recorded head stands.

Directory layout (files mode 0600):

    witness-key.pem    the witness's Ed25519 key (PKCS#8 PEM), made on first start
    witness-state.json {"log_public_key": b64, "sth": {...}}: the log pinned and the last head cosigned
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from traceless.errors import TracelessError
from traceless.privacy.translog.client import LogClient, LogState, write_private
from traceless.privacy.translog.cosignature import Cosignature, cosign, raw_public_key
from traceless.privacy.translog.tree_head import SignedTreeHead

KEY_FILE, STATE_FILE = "witness-key.pem", "witness-state.json"


class WitnessError(TracelessError):
    """The witness's directory is unusable, or it is pointed at another log than the one it pinned."""


def load_or_create_key(path: Path) -> Ed25519PrivateKey:
    if path.exists():
        if os.stat(path).st_mode & 0o077:
            raise WitnessError("the witness key file must be mode 0600")
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise WitnessError("the witness key is not Ed25519")
        return key
    key = Ed25519PrivateKey.generate()
    write_private(
        path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    return key


@dataclass(frozen=True, slots=True)
class CosignedHead:
    sth: SignedTreeHead
    cosignature: Cosignature


class Witness:
    def __init__(self, directory: str | os.PathLike[str], log_public_key: bytes) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._key = load_or_create_key(self.dir / KEY_FILE)
        self.log_public_key = log_public_key
        state = LogState.load(self.dir / STATE_FILE)
        if state is not None and state.public_key != log_public_key:
            raise WitnessError("this witness directory witnesses another log (its pinned key differs)")
        self.last: SignedTreeHead | None = state.sth if state is not None else None

    @property
    def public_key(self) -> bytes:
        return raw_public_key(self._key.public_key())

    def public_key_b64(self) -> str:
        return base64.b64encode(self.public_key).decode()

    def cosign_latest(self, log: LogClient, now_ms: int | None = None) -> CosignedHead:
        """Fetch, check and cosign the log's current head (LogClientError if it must not be cosigned)."""
        sth = log.get_sth()
        if self.last is not None:
            log.check_consistency(self.last, sth)
        if sth != self.last:  # persisted before signing: a crash cannot let a fork through afterwards
            LogState(self.log_public_key, sth).save(self.dir / STATE_FILE)
            self.last = sth
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return CosignedHead(sth, cosign(self._key, self.log_public_key, sth, now_ms))
