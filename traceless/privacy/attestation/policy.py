"""Which attesters a verifier accepts, and how much clock skew it forgives.

A software-attested document proves only that whoever holds the key signed it (the node's
operator included, see docs/attestation.md), so it is accepted only under an explicit
DEVELOPMENT policy that the deployment chose and printed; PRODUCTION (every default) refuses it
and accepts only the hardware attester (hardware.py), whose documents carry CPU TEE and GPU evidence
that the client's evidence policy (evidence_policy.py) then checks. The check names the policy in
its error, never a client value.
"""

from __future__ import annotations

from enum import Enum

from traceless.privacy.attestation.hardware import HardwareAttester
from traceless.privacy.attestation.software import AttestationError, SoftwareAttester

# Clocks of honest nodes and clients drift by seconds; a minute of leeway on iat/exp accepts
# them and lets a stale document live at most one minute longer.
CLOCK_LEEWAY_S = 60
SOFTWARE = SoftwareAttester.attester_type
# The attester types a production verifier accepts: documents signed by a key bound into CPU TEE
# (and GPU) reports, which the evidence policy verifies.
HARDWARE_TYPES = frozenset({HardwareAttester.attester_type})


class AttesterPolicy(Enum):
    PRODUCTION = "production"
    DEVELOPMENT = "development"


class AttesterTypeRefusedError(AttestationError):
    """The document's attester type is not allowed by the verifier's policy."""


def allowed_attester_types(policy: AttesterPolicy) -> frozenset[str]:
    if policy is AttesterPolicy.DEVELOPMENT:
        return HARDWARE_TYPES | {SOFTWARE}
    return HARDWARE_TYPES


def check_attester_type(policy: AttesterPolicy, attester_type: str) -> None:
    """Raise AttesterTypeRefusedError unless `policy` allows documents of `attester_type`."""
    if attester_type not in allowed_attester_types(policy):
        raise AttesterTypeRefusedError(
            f"the {policy.value} attestation policy does not accept this attester type"
            + (" (the software attester needs the explicit development policy)" if attester_type == SOFTWARE else "")
        )
