"""AMD SEV-SNP ATTESTATION_REPORT (SEV-SNP Firmware ABI Specification #56860, "ATTESTATION_REPORT
Structure"), report versions 2, 3, 4 and 5. All integers are little-endian.

    0x000 version u32        0x004 guest_svn u32     0x008 policy u64
    0x010 family_id [16]     0x020 image_id [16]     0x030 vmpl u32        0x034 signature_algo u32
    0x038 current_tcb [8]    0x040 platform_info u64 0x048 key_info u32    0x04C reserved
    0x050 report_data [64]   0x090 measurement [48]  0x0C0 host_data [32]
    0x0E0 id_key_digest [48] 0x110 author_key_digest [48]
    0x140 report_id [32]     0x160 report_id_ma [32] 0x180 reported_tcb [8]
    0x188 cpuid family, model, stepping (v3+; reserved in v2)
    0x1A0 chip_id [64]       0x1E0 committed_tcb [8]
    0x1E8 current build, minor, major, -        0x1EC committed build, minor, major, -
    0x1F0 launch_tcb [8]     0x1F8 launch_mit_vector u64, 0x200 current_mit_vector u64 (v5+)
    0x2A0 signature: r [72], s [72] little-endian, zero-padded; signed bytes are [0x000, 0x2A0)

A TCB_VERSION's byte layout depends on the processor line: Milan and Genoa put the SVNs at
bytes 0 (boot loader), 1 (TEE), 6 (SNP), 7 (microcode); Turin adds an FMC SVN and packs them at
0 (FMC), 1 (boot loader), 2 (TEE), 3 (SNP), 7 (microcode). The report itself names its line only
from version 3 on (CPUID family/model), so TCBs are kept raw here and decoded with `decode_tcb`
once the line is known (the verifier takes it from the AMD-signed VCEK).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum

from traceless.privacy.attestation.evidence import MalformedEvidenceError, UnsupportedEvidenceError

REPORT_SIZE = 0x4A0
SIGNED_SIZE = 0x2A0
SUPPORTED_VERSIONS = (2, 3, 4, 5)
ECDSA_P384_SHA384 = 1
_RS_SIZE = 72  # each of r and s, little-endian, zero-padded beyond the 48 bytes P-384 needs

# GUEST_POLICY bits (ABI spec, "GUEST_POLICY Structure")
_POLICY_SMT, _POLICY_RESERVED_1, _POLICY_MIGRATE_MA, _POLICY_DEBUG, _POLICY_SINGLE_SOCKET = 16, 17, 18, 19, 20
_POLICY_KNOWN_BITS = 26  # bits 26..63 must be zero


class ProductLine(Enum):
    MILAN = "Milan"
    GENOA = "Genoa"
    TURIN = "Turin"

    @property
    def has_fmc(self) -> bool:
        return self is ProductLine.TURIN


class Signer(Enum):
    """KEY_INFO.SIGNING_KEY: which endorsement key signed the report."""

    VCEK = 0
    VLEK = 1
    NONE = 7


@dataclass(frozen=True, slots=True)
class TcbVersion:
    """Security version numbers of the firmware components; `fmc` exists on Turin only."""

    bootloader: int
    tee: int
    snp: int
    microcode: int
    fmc: int | None = None

    def at_least(self, minimum: TcbVersion) -> bool:
        if minimum.fmc is not None and (self.fmc is None or self.fmc < minimum.fmc):
            return False
        return (
            self.bootloader >= minimum.bootloader
            and self.tee >= minimum.tee
            and self.snp >= minimum.snp
            and self.microcode >= minimum.microcode
        )

    def __str__(self) -> str:
        fmc = "" if self.fmc is None else f"fmc={self.fmc} "
        return f"{fmc}bl={self.bootloader} tee={self.tee} snp={self.snp} ucode={self.microcode}"


def decode_tcb(raw: bytes, line: ProductLine) -> TcbVersion:
    if len(raw) != 8:
        raise MalformedEvidenceError("TCB_VERSION is not 8 bytes")
    if line.has_fmc:
        if any(raw[4:7]):
            raise MalformedEvidenceError("Turin TCB_VERSION reserved bytes 4..6 are not zero")
        return TcbVersion(bootloader=raw[1], tee=raw[2], snp=raw[3], microcode=raw[7], fmc=raw[0])
    return TcbVersion(bootloader=raw[0], tee=raw[1], snp=raw[6], microcode=raw[7])


def encode_tcb(tcb: TcbVersion, line: ProductLine) -> bytes:
    """The 8-byte TCB_VERSION of `tcb` in `line`'s layout (the inverse of `decode_tcb`)."""
    if line.has_fmc:
        return bytes([tcb.fmc or 0, tcb.bootloader, tcb.tee, tcb.snp, 0, 0, 0, tcb.microcode])
    return bytes([tcb.bootloader, tcb.tee, 0, 0, 0, 0, tcb.snp, tcb.microcode])


@dataclass(frozen=True, slots=True)
class GuestPolicy:
    abi_minor: int
    abi_major: int
    smt_allowed: bool
    migrate_ma: bool
    debug: bool
    single_socket: bool
    raw: int


@dataclass(frozen=True, slots=True)
class SnpReport:
    version: int
    guest_svn: int
    policy: GuestPolicy
    family_id: bytes
    image_id: bytes
    vmpl: int
    signature_algo: int
    current_tcb: bytes  # raw TCB_VERSIONs: see decode_tcb
    platform_info: int
    author_key_en: bool
    mask_chip_key: bool
    signer: Signer
    report_data: bytes
    measurement: bytes
    host_data: bytes
    id_key_digest: bytes
    author_key_digest: bytes
    report_id: bytes
    report_id_ma: bytes
    reported_tcb: bytes
    cpuid: tuple[int, int, int] | None  # (family, model, stepping), version 3 and later
    chip_id: bytes
    committed_tcb: bytes
    current_version: tuple[int, int, int]  # (major, minor, build) of the firmware
    committed_version: tuple[int, int, int]
    launch_tcb: bytes
    mit_vectors: tuple[int, int] | None  # (launch, current), version 5 and later
    signed_bytes: bytes  # [0, 0x2A0)
    signature_r: int
    signature_s: int

    @property
    def product_line(self) -> ProductLine | None:
        """The line the report's CPUID names (version 3+), None when the report does not say."""
        if self.cpuid is None:
            return None
        family, model, _ = self.cpuid
        if family == 0x19:
            return ProductLine.MILAN if model <= 0x0F else ProductLine.GENOA
        if family == 0x1A and model <= 0x11:
            return ProductLine.TURIN
        return None


def parse_policy(raw: int) -> GuestPolicy:
    if not raw >> _POLICY_RESERVED_1 & 1:
        raise MalformedEvidenceError("guest policy bit 17 (reserved, must be one) is zero")
    if raw >> _POLICY_KNOWN_BITS:
        raise MalformedEvidenceError("guest policy has bits set above bit 25")
    return GuestPolicy(
        abi_minor=raw & 0xFF,
        abi_major=raw >> 8 & 0xFF,
        smt_allowed=bool(raw >> _POLICY_SMT & 1),
        migrate_ma=bool(raw >> _POLICY_MIGRATE_MA & 1),
        debug=bool(raw >> _POLICY_DEBUG & 1),
        single_socket=bool(raw >> _POLICY_SINGLE_SOCKET & 1),
        raw=raw,
    )


def parse_snp_report(data: bytes) -> SnpReport:
    """Parse exactly one 1184-byte report. Raises MalformedEvidenceError / UnsupportedEvidenceError."""
    data = bytes(data)
    if len(data) != REPORT_SIZE:
        raise MalformedEvidenceError(f"SEV-SNP report is {len(data)} bytes, expected {REPORT_SIZE}")
    version, guest_svn, policy = struct.unpack_from("<IIQ", data, 0x000)
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedEvidenceError(f"SEV-SNP report version {version} (supported: 2 to 5)")
    vmpl, signature_algo = struct.unpack_from("<II", data, 0x030)
    platform_info, key_info = struct.unpack_from("<QI", data, 0x040)
    if key_info >> 5:
        raise MalformedEvidenceError("KEY_INFO bits 5..31 are not zero")
    signing_key = key_info >> 2 & 7
    if signing_key not in (0, 1, 7):
        raise MalformedEvidenceError(f"KEY_INFO.SIGNING_KEY {signing_key} is reserved")
    if signature_algo == ECDSA_P384_SHA384 and any(data[SIGNED_SIZE + 2 * _RS_SIZE :]):
        raise MalformedEvidenceError("signature bytes after r and s are not zero")
    mit = struct.unpack_from("<QQ", data, 0x1F8) if version >= 5 else None
    return SnpReport(
        version=version,
        guest_svn=guest_svn,
        policy=parse_policy(policy),
        family_id=data[0x10:0x20],
        image_id=data[0x20:0x30],
        vmpl=vmpl,
        signature_algo=signature_algo,
        current_tcb=data[0x38:0x40],
        platform_info=platform_info,
        author_key_en=bool(key_info & 1),
        mask_chip_key=bool(key_info >> 1 & 1),
        signer=Signer(signing_key),
        report_data=data[0x50:0x90],
        measurement=data[0x90:0xC0],
        host_data=data[0xC0:0xE0],
        id_key_digest=data[0xE0:0x110],
        author_key_digest=data[0x110:0x140],
        report_id=data[0x140:0x160],
        report_id_ma=data[0x160:0x180],
        reported_tcb=data[0x180:0x188],
        cpuid=(data[0x188], data[0x189], data[0x18A]) if version >= 3 else None,
        chip_id=data[0x1A0:0x1E0],
        committed_tcb=data[0x1E0:0x1E8],
        current_version=(data[0x1EA], data[0x1E9], data[0x1E8]),
        committed_version=(data[0x1EE], data[0x1ED], data[0x1EC]),
        launch_tcb=data[0x1F0:0x1F8],
        mit_vectors=mit,
        signed_bytes=data[0:SIGNED_SIZE],
        signature_r=int.from_bytes(data[SIGNED_SIZE : SIGNED_SIZE + _RS_SIZE], "little"),
        signature_s=int.from_bytes(data[SIGNED_SIZE + _RS_SIZE : SIGNED_SIZE + 2 * _RS_SIZE], "little"),
    )
