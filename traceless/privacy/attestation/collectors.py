"""Node side: getting hardware evidence from the machine a node runs on.

A collector turns the node's binding value (64 bytes for a CPU report's REPORT_DATA, 32 for the
GPU's SPDM nonce) into raw evidence for a client to verify. Collectors never verify anything:
the node's own opinion of its evidence proves nothing to a client.

    evidence = TsmCollector().collect(report_data)          # SEV-SNP or TDX, via configfs-tsm
    evidence = NvmlCollector().collect(nonce)               # NVIDIA GPU, via NVML in CC mode

On a machine without the device, driver or mode, `collect` raises a `CollectorUnavailableError`
subclass that says which is missing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from traceless.errors import TracelessError


class CollectorError(TracelessError):
    """The node could not produce hardware evidence."""


class CollectorUnavailableError(CollectorError):
    """This machine lacks what the collector needs (device, driver, library or mode)."""


class NoTsmError(CollectorUnavailableError):
    """No configfs-tsm report interface: not a confidential VM, or the kernel is too old (< 6.7)."""


class NoGpuAttestationError(CollectorUnavailableError):
    """No NVML library, no NVIDIA GPU, or the GPU is not in confidential-computing mode."""


class EvidenceRaceError(CollectorError):
    """Another writer changed the report request while this one was being generated."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """Raw evidence as a node ships it. `kind` says which verifier takes it."""

    kind: str  # "snp" | "tdx" | "nvidia"
    blob: bytes  # SNP: ATTESTATION_REPORT; TDX: quote; NVIDIA: SPDM request || response
    aux: bytes = b""  # SNP: certificate table (auxblob); NVIDIA: PEM certificate chain; TDX: empty
    provider: str = ""  # where it came from: configfs-tsm provider name, or "nvml"


class Collector(ABC):
    """Interface of every evidence source."""

    @abstractmethod
    def collect(self, report_data: bytes) -> Evidence:
        """Evidence that binds `report_data` (REPORT_DATA for CPUs, the SPDM nonce for GPUs)."""
