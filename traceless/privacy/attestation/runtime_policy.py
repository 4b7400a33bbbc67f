"""The confidential runtime's own policy, bound into the CPU report by the host at launch.

A Kata Containers guest runs an agent that obeys the host's requests (create a container, exec
into it, read its output) only as its agent policy allows; a restrictive policy refuses exec,
attach and reading a container's streams. The policy reaches the guest inside an *initdata*
document (a TOML file: `version = "0.1.0"`, `algorithm = "sha256" | "sha384" | "sha512"`, and a
`[data]` table whose `"policy.rego"` entry is the agent policy), and the host binds that document
into the launch: its digest, with the document's own algorithm, over the document's bytes exactly
as the guest receives them, cut or zero-padded to the field's length, is SEV-SNP's HOST_DATA (32
bytes) or TDX's MRCONFIGID (48 bytes). The guest checks the document it got against the field; the
client checks the field against the digests its evidence policy allows (evidence_policy.py), so a
node whose runtime was started with another policy (one that allows exec) is refused.
"""

from __future__ import annotations

import hashlib
import tomllib

from traceless.privacy.attestation.software import AttestationError

INITDATA_VERSION = "0.1.0"
ALGORITHMS = ("sha256", "sha384", "sha512")
FIELD_SIZE = {"snp": 32, "tdx": 48}  # HOST_DATA, MRCONFIGID
# the checks a refusal names (evidence_policy.py: "snp:host-data", "tdx:mr-config-id")
RUNTIME_POLICY_CHECKS = ("host-data", "mr-config-id")


class InitdataError(AttestationError):
    """Bytes that are not an initdata document this module can digest."""


def initdata_digest(document: bytes, kind: str) -> bytes:
    """What a `kind` ("snp" or "tdx") report holds for a guest launched with this initdata document."""
    if kind not in FIELD_SIZE:
        raise InitdataError("initdata binds only SEV-SNP HOST_DATA and TDX MRCONFIGID")
    try:
        doc = tomllib.loads(document.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        raise InitdataError("the initdata document is not UTF-8 TOML") from None
    if doc.get("version") != INITDATA_VERSION:
        raise InitdataError(f"the initdata document's version must be {INITDATA_VERSION}")
    algorithm = doc.get("algorithm")
    if algorithm not in ALGORITHMS:
        raise InitdataError(f"the initdata document's algorithm must be one of {', '.join(ALGORITHMS)}")
    if not isinstance(doc.get("data"), dict):
        raise InitdataError("the initdata document has no [data] table")
    digest = hashlib.new(algorithm, document).digest()
    size = FIELD_SIZE[kind]
    return digest[:size].ljust(size, b"\0")
