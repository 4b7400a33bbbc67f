"""What a node proves and the keys it proves it with."""
from __future__ import annotations

import os
import time

from traceless.node.keyring import KeyRing
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import Attester, NodeStatement, new_claims


class NodeIdentity:
    """What the node proves and the keys it proves it with. The OHTTP keys are generated here, in
    memory, rotate (keyring.py) and never leave the process: a restart is a cryptographic erase.
    Every document states the node's measurement, every live OHTTP key, its capacity and the URL
    it serves at (registration binds to it)."""

    def __init__(self, attester: Attester, measurement: Measurement, *, capacity: int = 1,
                 node_url: str = "", keys: KeyRing | None = None):
        self.keys = keys if keys is not None else KeyRing()
        self.attester = attester
        self.measurement = measurement
        self.capacity = capacity
        self.node_url = node_url

    def ohttp_keys(self) -> bytes:
        return self.keys.ohttp_keys()

    def attestation(self, nonce: bytes | None, ttl_s: int) -> tuple[str, bytes]:
        """(document, the application/ohttp-keys body it binds), read together so a rotation in
        between cannot split them."""
        ohttp_keys = self.keys.ohttp_keys()
        statement = NodeStatement(self.measurement, ohttp_keys, self.capacity, self.node_url)
        claims = new_claims(statement, nonce or os.urandom(16), int(time.time()), self.attester.attester_type, ttl_s)
        return self.attester.attest(claims), ohttp_keys
