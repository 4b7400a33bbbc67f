"""Intel TDX quotes, versions 4 and 5 (Intel TDX DCAP Quote Generation Library and Quote
Verification Library API, "Quote Format"). Integers are little-endian; digests and keys are raw.

    quote v4:  header [48] | TD report body [584]                       | u32 len | signature data
    quote v5:  header [48] | body type u16, body size u32, body [size]  | u32 len | signature data
               body type 2 = TD report 1.0 (584 bytes), 3 = TD report 1.5 (648 bytes)
    signed by the attestation key: every byte before the u32 len (header and body).

    header:  version u16 | attestation key type u16 (2: ECDSA P-256) | TEE type u32 (0x81: TDX)
             | reserved [4] | QE vendor ID [16] | user data [20]
    TD report 1.0:  TEE_TCB_SVN [16] | MRSEAM [48] | MRSIGNERSEAM [48] | SEAM attributes [8]
             | TD attributes [8] | XFAM [8] | MRTD [48] | MRCONFIGID [48] | MROWNER [48]
             | MROWNERCONFIG [48] | RTMR0..3 [4 x 48] | REPORTDATA [64]
    TD report 1.5:  TD report 1.0 | TEE_TCB_SVN2 [16] | MRSERVICETD [48]

    signature data:  quote signature [64: r, s big-endian] | attestation public key [64: x, y]
                     | certification data: type u16 (6) | size u32 | QE report certification data
    QE report certification data:  QE report [384, an SGX enclave report] | QE report signature [64]
                     | QE auth data: size u16, data | certification data: type u16 (5) | size u32 | PCK chain PEM

The quoting enclave binds the attestation key: QE report REPORTDATA = SHA-256(attestation key ||
QE auth data) || 32 zero bytes, and the PCK key (certified by Intel) signs the QE report.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from traceless.privacy.attestation.evidence import MalformedEvidenceError, UnsupportedEvidenceError

HEADER_SIZE = 48
TD_REPORT_10_SIZE, TD_REPORT_15_SIZE = 584, 648
QE_REPORT_SIZE = 384
TEE_TDX = 0x81
ECDSA_P256 = 2
_QE_REPORT_CERT_DATA, _PCK_CHAIN_CERT_DATA = 6, 5
_BODY_V5 = {2: TD_REPORT_10_SIZE, 3: TD_REPORT_15_SIZE}


@dataclass(frozen=True, slots=True)
class TdReport:
    tee_tcb_svn: bytes
    mr_seam: bytes
    mr_signer_seam: bytes
    seam_attributes: bytes
    td_attributes: bytes  # 8 bytes, little-endian bit field; bit 0 is DEBUG
    xfam: bytes
    mr_td: bytes
    mr_config_id: bytes
    mr_owner: bytes
    mr_owner_config: bytes
    rtmrs: tuple[bytes, bytes, bytes, bytes]
    report_data: bytes
    tee_tcb_svn2: bytes | None = None  # TD report 1.5 only
    mr_service_td: bytes | None = None  # TD report 1.5 only

    @property
    def debug(self) -> bool:
        return bool(self.td_attributes[0] & 1)


@dataclass(frozen=True, slots=True)
class QeReport:
    raw: bytes  # the 384 bytes the PCK key signed
    cpu_svn: bytes
    misc_select: int
    attributes: bytes
    mr_enclave: bytes
    mr_signer: bytes
    isv_prod_id: int
    isv_svn: int
    report_data: bytes


@dataclass(frozen=True, slots=True)
class TdxQuote:
    version: int
    header: bytes
    qe_vendor_id: bytes
    td_report: TdReport
    signed_bytes: bytes  # header and body: what the attestation key signed
    signature: bytes  # r || s, big-endian
    attestation_key: bytes  # x || y
    qe_report: QeReport
    qe_report_signature: bytes
    qe_auth_data: bytes
    pck_chain_pem: bytes


class _Reader:
    """Bounds-checked sequential reads; every read past the end is a MalformedEvidenceError."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int, field: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise MalformedEvidenceError(f"{self.what}: {field} runs past the end ({len(self.data)} bytes)")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def u16(self, field: str) -> int:
        return struct.unpack("<H", self.take(2, field))[0]

    def u32(self, field: str) -> int:
        return struct.unpack("<I", self.take(4, field))[0]

    def end(self) -> None:
        if self.pos != len(self.data):
            raise MalformedEvidenceError(f"{self.what}: {len(self.data) - self.pos} bytes after its last field")


def parse_td_report(body: bytes) -> TdReport:
    r = _Reader(body, "TD report")
    tee_tcb_svn, mr_seam, mr_signer_seam = r.take(16, "TEE_TCB_SVN"), r.take(48, "MRSEAM"), r.take(48, "MRSIGNERSEAM")
    seam_attributes, td_attributes, xfam = r.take(8, "SEAMATTRIBUTES"), r.take(8, "TDATTRIBUTES"), r.take(8, "XFAM")
    mr_td, mr_config_id = r.take(48, "MRTD"), r.take(48, "MRCONFIGID")
    mr_owner, mr_owner_config = r.take(48, "MROWNER"), r.take(48, "MROWNERCONFIG")
    rtmrs = (r.take(48, "RTMR0"), r.take(48, "RTMR1"), r.take(48, "RTMR2"), r.take(48, "RTMR3"))
    report_data = r.take(64, "REPORTDATA")
    extra = (r.take(16, "TEE_TCB_SVN2"), r.take(48, "MRSERVICETD")) if len(body) == TD_REPORT_15_SIZE else (None, None)
    r.end()
    return TdReport(
        tee_tcb_svn,
        mr_seam,
        mr_signer_seam,
        seam_attributes,
        td_attributes,
        xfam,
        mr_td,
        mr_config_id,
        mr_owner,
        mr_owner_config,
        rtmrs=rtmrs,
        report_data=report_data,
        tee_tcb_svn2=extra[0],
        mr_service_td=extra[1],
    )


def parse_qe_report(raw: bytes) -> QeReport:
    if len(raw) != QE_REPORT_SIZE:
        raise MalformedEvidenceError(f"QE report is {len(raw)} bytes, expected {QE_REPORT_SIZE}")
    (misc_select,) = struct.unpack_from("<I", raw, 16)
    isv_prod_id, isv_svn = struct.unpack_from("<HH", raw, 256)
    return QeReport(
        raw=raw,
        cpu_svn=raw[0:16],
        misc_select=misc_select,
        attributes=raw[48:64],
        mr_enclave=raw[64:96],
        mr_signer=raw[128:160],
        isv_prod_id=isv_prod_id,
        isv_svn=isv_svn,
        report_data=raw[320:384],
    )


def _header(r: _Reader) -> tuple[int, bytes]:
    header = r.take(HEADER_SIZE, "header")
    version, key_type, tee_type = struct.unpack_from("<HHI", header, 0)
    if version not in (4, 5):
        raise UnsupportedEvidenceError(f"quote version {version} (supported: 4 and 5)")
    if tee_type != TEE_TDX:
        raise UnsupportedEvidenceError(f"quote TEE type 0x{tee_type:x} is not TDX (0x81)")
    if key_type != ECDSA_P256:
        raise UnsupportedEvidenceError(f"attestation key type {key_type} is not ECDSA P-256 (2)")
    return version, header


def _body(r: _Reader, version: int) -> bytes:
    if version == 4:
        return r.take(TD_REPORT_10_SIZE, "TD report body")
    body_type, size = r.u16("body type"), r.u32("body size")
    if _BODY_V5.get(body_type) != size:
        raise UnsupportedEvidenceError(f"quote v5 body type {body_type} of {size} bytes is not a TD report 1.0/1.5")
    return r.take(size, "TD report body")


def _certification(data: bytes) -> tuple[QeReport, bytes, bytes, bytes]:
    """QE report certification data (type 6) -> QE report, its signature, QE auth data, PCK chain."""
    r = _Reader(data, "QE report certification data")
    qe_report = parse_qe_report(r.take(QE_REPORT_SIZE, "QE report"))
    qe_signature = r.take(64, "QE report signature")
    auth = r.take(r.u16("QE auth data size"), "QE auth data")
    kind, size = r.u16("certification data type"), r.u32("certification data size")
    if kind != _PCK_CHAIN_CERT_DATA:
        raise UnsupportedEvidenceError(f"inner certification data type {kind} is not a PCK chain (5)")
    chain = r.take(size, "PCK certificate chain")
    r.end()
    return qe_report, qe_signature, auth, chain


def parse_tdx_quote(data: bytes) -> TdxQuote:
    """Parse a whole quote; bytes after the signature data are refused (they would be unsigned)."""
    data = bytes(data)
    r = _Reader(data, "TDX quote")
    version, header = _header(r)
    body = _body(r, version)
    signed_end = r.pos
    signature_data = _Reader(r.take(r.u32("signature data size"), "signature data"), "signature data")
    r.end()
    signature = signature_data.take(64, "quote signature")
    key = signature_data.take(64, "attestation key")
    kind, size = signature_data.u16("certification data type"), signature_data.u32("certification data size")
    if kind != _QE_REPORT_CERT_DATA:
        raise UnsupportedEvidenceError(f"certification data type {kind} is not QE report certification data (6)")
    qe_report, qe_signature, auth, chain = _certification(signature_data.take(size, "certification data"))
    signature_data.end()
    return TdxQuote(
        version=version,
        header=header,
        qe_vendor_id=header[12:28],
        td_report=parse_td_report(body),
        signed_bytes=data[:signed_end],
        signature=signature,
        attestation_key=key,
        qe_report=qe_report,
        qe_report_signature=qe_signature,
        qe_auth_data=auth,
        pck_chain_pem=chain,
    )
