"""AMD's certificates around an SEV-SNP report: the VCEK/VLEK's X.509 extensions (AMD Key
Distribution Service, OIDs under 1.3.6.1.4.1.3704.1) and the extended report's certificate table.

VCEK extensions (each value is DER: an INTEGER for the SPLs, an IA5String for the product name;
the hardware ID is the raw bytes, without a DER header):

    .1 structVersion  .2 productName ("Milan-B0", "Genoa", "Turin", ...)
    .3.1 blSPL  .3.2 teeSPL  .3.3 snpSPL  .3.4-.3.7 reserved SPLs  .3.8 ucodeSPL  .3.9 fmcSPL (Turin)
    .4 hwID (the CHIP_ID: 64 bytes on Milan/Genoa, 8 on Turin)  .5 cspID (VLEK only)

Certificate table (GHCB specification, SNP extended guest request; what configfs-tsm's
`auxblob` returns): entries of GUID (16 bytes, RFC 4122 byte order), offset u32, length u32,
ended by an all-zero entry; offsets are from the start of the table.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from cryptography import x509

from traceless.privacy.attestation.evidence import MalformedEvidenceError
from traceless.privacy.attestation.snp_report import ProductLine, TcbVersion

_AMD_OID = "1.3.6.1.4.1.3704.1."
_PRODUCT_NAME, _HWID, _CSP_ID = "2", "4", "5"
_SPL = {"bootloader": "3.1", "tee": "3.2", "snp": "3.3", "microcode": "3.8", "fmc": "3.9"}
_RESERVED_SPL = ("3.4", "3.5", "3.6", "3.7")

VCEK_GUID = uuid.UUID("63da758d-e664-4564-adc5-f4b93be8accd")
VLEK_GUID = uuid.UUID("a8074bc2-a25a-483e-aae6-39c045a0b8a1")
ASK_GUID = uuid.UUID("4ab7b379-bbac-4fe4-a02f-05aef327c782")  # also the ASVK for a VLEK
ARK_GUID = uuid.UUID("c0b406a4-a803-4952-9743-3fb6014cd0ae")
_ENTRY = struct.Struct("<16sII")


@dataclass(frozen=True, slots=True)
class EndorsementExtensions:
    """What AMD's KDS wrote into a VCEK or VLEK certificate."""

    product_name: str
    product_line: ProductLine
    tcb: TcbVersion
    reserved_spls: tuple[int, int, int, int]  # .3.4 to .3.7 (absent ones read as 0)
    hwid: bytes | None  # VCEK only
    csp_id: str | None  # VLEK only


def _der_integer(value: bytes, what: str) -> int:
    # A small non-negative DER INTEGER: 02 len content, minimal encoding (SPLs are 0..255).
    if len(value) < 3 or value[0] != 0x02 or value[1] != len(value) - 2 or value[1] > 2:
        raise MalformedEvidenceError(f"VCEK extension {what} is not a small DER INTEGER")
    content = value[2:]
    if content[0] & 0x80 or (len(content) == 2 and content[0] == 0 and not content[1] & 0x80):
        raise MalformedEvidenceError(f"VCEK extension {what} is not a minimal non-negative INTEGER")
    return int.from_bytes(content, "big")


def _ia5_string(value: bytes, what: str) -> str:
    if len(value) < 2 or value[0] != 0x16 or value[1] != len(value) - 2 or value[1] >= 0x80:
        raise MalformedEvidenceError(f"VCEK extension {what} is not a short IA5String")
    text = value[2:]
    if not text.isascii():
        raise MalformedEvidenceError(f"VCEK extension {what} is not ASCII")
    return text.decode("ascii")


def product_line(name: str) -> ProductLine:
    """ "Milan-B0" -> MILAN: the product name is the line, optionally followed by a stepping."""
    base = name.split("-", 1)[0]
    for line in ProductLine:
        if line.value == base:
            return line
    raise MalformedEvidenceError(f"unknown AMD product name {name!r}")


def endorsement_extensions(cert: x509.Certificate) -> EndorsementExtensions:
    amd = {
        e.oid.dotted_string[len(_AMD_OID) :]: e.value.value
        for e in cert.extensions
        if e.oid.dotted_string.startswith(_AMD_OID) and isinstance(e.value, x509.UnrecognizedExtension)
    }
    if _PRODUCT_NAME not in amd:
        raise MalformedEvidenceError("certificate has no AMD productName extension: not a VCEK or VLEK")
    name = _ia5_string(amd[_PRODUCT_NAME], "productName")
    line = product_line(name)
    spl = {}
    for field, oid in _SPL.items():
        if oid in amd:
            spl[field] = _der_integer(amd[oid], field + "SPL")
        elif field != "fmc" or line.has_fmc:
            raise MalformedEvidenceError(f"certificate lacks the {field}SPL extension")
    reserved = tuple(_der_integer(amd[o], "spl" + o[-1]) if o in amd else 0 for o in _RESERVED_SPL)
    hwid = amd.get(_HWID)
    csp = _ia5_string(amd[_CSP_ID], "cspID") if _CSP_ID in amd else None
    if (hwid is None) == (csp is None):
        raise MalformedEvidenceError("certificate must carry exactly one of hwID (VCEK) and cspID (VLEK)")
    return EndorsementExtensions(
        product_name=name,
        product_line=line,
        tcb=TcbVersion(**spl),
        reserved_spls=reserved,  # type: ignore[arg-type]
        hwid=hwid,
        csp_id=csp,
    )


@dataclass(frozen=True, slots=True)
class CertTable:
    """The certificates of an SNP extended report, raw (DER as the host stored them), by GUID."""

    entries: tuple[tuple[uuid.UUID, bytes], ...]

    def get(self, guid: uuid.UUID) -> bytes | None:
        return next((blob for g, blob in self.entries if g == guid), None)

    @property
    def endorsement_key(self) -> bytes | None:
        return self.get(VCEK_GUID) or self.get(VLEK_GUID)


def parse_cert_table(data: bytes) -> CertTable:
    """Parse a GUID certificate table. An empty blob is an empty table."""
    data = bytes(data)
    entries: list[tuple[uuid.UUID, int, int]] = []
    pos = 0
    while True:
        if pos + _ENTRY.size > len(data):
            if not data:
                return CertTable(())
            raise MalformedEvidenceError("certificate table ends without its all-zero terminator entry")
        guid, offset, length = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        if guid == bytes(16) and offset == 0 and length == 0:
            break
        entries.append((uuid.UUID(bytes=guid), offset, length))
    table = []
    for guid, offset, length in entries:
        if offset < pos or offset + length > len(data) or length == 0:
            raise MalformedEvidenceError(f"certificate table entry {guid} points outside the certificate data")
        table.append((guid, data[offset : offset + length]))
    if len({g for g, _ in table}) != len(table):
        raise MalformedEvidenceError("certificate table lists a GUID twice")
    return CertTable(tuple(table))


def build_cert_table(entries: list[tuple[uuid.UUID, bytes]]) -> bytes:
    """The inverse of `parse_cert_table` (for tests and for hosts that assemble the table)."""
    header = (len(entries) + 1) * _ENTRY.size
    out, blobs, offset = bytearray(), bytearray(), header
    for guid, blob in entries:
        out += _ENTRY.pack(guid.bytes, offset, len(blob))
        blobs += blob
        offset += len(blob)
    return bytes(out + bytes(_ENTRY.size) + blobs)
