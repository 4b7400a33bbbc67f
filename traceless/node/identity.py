"""What a node proves and the keys it proves it with."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from traceless.node.evidence_cache import EvidenceCache, EvidenceLimits, Vouched
from traceless.node.keyring import KeyRing
from traceless.privacy.attestation.hardware import HardwareAttester, evidence_to_json
from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import Attester, NodeStatement, new_claims


@dataclass(frozen=True, slots=True)
class NodeAttestation:
    """A document made now, the OHTTP keys it binds and, for a hardware attester, the base document
    whose evidence vouches for the key that signed it (privacy/attestation/vouched.py)."""

    document: str = field(repr=False)
    ohttp_keys: bytes = field(repr=False)
    base: str | None = field(default=None, repr=False)
    evidence: tuple[dict[str, str], ...] = field(default=(), repr=False)

    def to_json(self) -> dict:
        """As the attestation route serves it and a registration carries it."""
        out: dict = {
            "attestation": self.document,
            "ohttp_keys": base64.b64encode(self.ohttp_keys).decode(),
            "evidence": list(self.evidence),
        }
        if self.base is not None:
            out["base_attestation"] = self.base
        return out


class NodeIdentity:
    """What the node proves and the keys it proves it with. The OHTTP keys are generated here, in
    memory, rotate (keyring.py) and never leave the process: a restart is a cryptographic erase.
    Every document states the node's measurement, every live OHTTP key, its capacity and the URL
    it serves at (registration binds to it). A hardware attester's evidence is collected once per
    key set, over a base document, at most once per `evidence_limits.min_interval_s`
    (evidence_cache.py); each nonce gets a fresh document by the key it vouches for."""

    def __init__(
        self,
        attester: Attester,
        measurement: Measurement,
        *,
        capacity: int = 1,
        node_url: str = "",
        keys: KeyRing | None = None,
        evidence_limits: EvidenceLimits = EvidenceLimits(),
        clock: Callable[[], float] = time.time,
    ):
        self.keys = keys if keys is not None else KeyRing()
        self.attester = attester
        self.measurement = measurement
        self.capacity = capacity
        self.node_url = node_url
        self.evidence_cache = EvidenceCache(evidence_limits, clock)
        self._clock = clock

    def ohttp_keys(self) -> bytes:
        return self.keys.ohttp_keys()

    def _statement(self, ohttp_keys: bytes) -> NodeStatement:
        return NodeStatement(self.measurement, ohttp_keys, self.capacity, self.node_url)

    def attestation(self, nonce: bytes | None, ttl_s: int) -> tuple[str, bytes]:
        """(document, the application/ohttp-keys body it binds), read together so a rotation in
        between cannot split them."""
        ohttp_keys = self.keys.ohttp_keys()
        claims = new_claims(
            self._statement(ohttp_keys), nonce or os.urandom(16), int(self._clock()), self.attester.attester_type, ttl_s
        )
        return self.attester.attest(claims), ohttp_keys

    def attest_now(self, nonce: bytes | None, ttl_s: int) -> NodeAttestation:
        """A document for `nonce` valid for `ttl_s` (at most until its base expires) and, for a
        hardware attester, its base and evidence. Blocking when the evidence is due (call it off
        the event loop); raises CollectorError or EvidenceRateLimitedError then."""
        if not isinstance(self.attester, HardwareAttester):
            document, ohttp_keys = self.attestation(nonce, ttl_s)
            return NodeAttestation(document, ohttp_keys)
        min_valid = min(ttl_s, self.evidence_cache.limits.ttl_s // 2)
        base = self.evidence_cache.base(self._statement(self.keys.ohttp_keys()), min_valid, self._collect)
        now = int(self._clock())
        claims = new_claims(
            base.statement,
            nonce or os.urandom(16),
            now,
            self.attester.attester_type,
            max(1, min(ttl_s, base.exp - now)),
        )
        return NodeAttestation(self.attester.attest(claims), base.statement.ohttp_keys, base.document, base.evidence)

    def _collect(self, statement: NodeStatement) -> Vouched:
        """A base document stating `statement` under the node's own random nonce, and its evidence."""
        claims = new_claims(
            statement, os.urandom(16), int(self._clock()), self.attester.attester_type, self.evidence_cache.limits.ttl_s
        )
        document = self.attester.attest(claims)
        return Vouched(statement, document, tuple(self.evidence(document)), claims.exp)

    @property
    def attestation_kind(self) -> str:
        """ "hardware" or "software": the attester type every document of this node names."""
        return self.attester.attester_type

    def evidence(self, document: str) -> list[dict[str, str]]:
        """The hardware evidence binding `document`, as the JSON list served beside it ([] for the
        software attester, which has none). Blocking (configfs, NVML): call it off the event loop.
        Raises `CollectorError` when the hardware cannot produce it."""
        if not isinstance(self.attester, HardwareAttester):
            return []
        return [evidence_to_json(item) for item in self.attester.evidence(document)]
