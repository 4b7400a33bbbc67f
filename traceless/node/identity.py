"""What a node proves and the keys it proves it with."""
from __future__ import annotations

import os
import time

from traceless.node.keyring import KeyRing
from traceless.privacy.attestation.hardware import HardwareAttester, evidence_to_json
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

    @property
    def attestation_kind(self) -> str:
        """"hardware" or "software": the attester type every document of this node names."""
        return self.attester.attester_type

    def evidence(self, document: str) -> list[dict[str, str]]:
        """The hardware evidence binding `document`, as the JSON list served beside it ([] for the
        software attester, which has none). Blocking (configfs, NVML): call it off the event loop.
        Raises `CollectorError` when the hardware cannot produce it."""
        if not isinstance(self.attester, HardwareAttester):
            return []
        return [evidence_to_json(item) for item in self.attester.evidence(document)]
