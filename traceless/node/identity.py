"""What a node proves and the keys it proves it with."""
from __future__ import annotations

import os
import time

from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import Attester, new_claims
from traceless.privacy.ohttp.gateway import OhttpServer


class NodeIdentity:
    """What the node proves and the keys it proves it with. The OHTTP key pair is generated here,
    in memory, and never leaves the process: a restart is a cryptographic erase."""

    def __init__(self, attester: Attester, measurement: Measurement):
        self.ohttp = OhttpServer()
        self.attester = attester
        self.measurement = measurement
        self.ohttp_keys = self.ohttp.ohttp_keys()

    def attestation(self, nonce: bytes | None, ttl_s: int) -> str:
        claims = new_claims(self.measurement, self.ohttp.key_config.encode(), nonce or os.urandom(16),
                            int(time.time()), self.attester.attester_type, ttl_s)
        return self.attester.attest(claims)
