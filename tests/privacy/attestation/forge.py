"""Synthetic SEV-SNP evidence under a test AMD chain, for negative tests and end-to-end tests.

The test chain has AMD's shape: an RSA ARK (self-signed) and ASK, both signing with RSA-PSS
SHA-384 (salt 48), and a P-384 VCEK (or VLEK) carrying AMD's KDS extensions. RSA-2048 keeps the
tests fast (AMD uses 4096; the verifier does not depend on the size). Reports are laid out and
signed exactly as the secure processor does, so forged evidence goes through the same verifier
code path as real evidence, with the test ARK pinned instead of AMD's.

    forged = forge_snp_evidence(report_data=binding, measurement=release)
    result = verify_snp(forged.evidence, forged.trust, report_data=binding)   # passes
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from traceless.privacy.attestation.snp import SnpEvidence, SnpTrust
from traceless.privacy.attestation.snp_certs import ARK_GUID, ASK_GUID, VCEK_GUID, VLEK_GUID, build_cert_table
from traceless.privacy.attestation.snp_report import REPORT_SIZE, SIGNED_SIZE, ProductLine, TcbVersion, encode_tcb

MILAN_TCB = TcbVersion(bootloader=3, tee=0, snp=8, microcode=115)
TURIN_TCB = TcbVersion(bootloader=1, tee=0, snp=9, microcode=2, fmc=1)
NOT_BEFORE = datetime(2020, 1, 1, tzinfo=UTC)
NOT_AFTER = datetime(2050, 1, 1, tzinfo=UTC)
POLICY_DEFAULT = 0x30000  # SMT allowed (bit 16), reserved bit 17 set: what the real Milan sample has
POLICY_DEBUG = 1 << 19
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)
_AMD = "1.3.6.1.4.1.3704.1."


@dataclass(frozen=True, slots=True)
class AmdTestChain:
    """Private keys and DER certificates of a test ARK -> ASK -> VCEK chain."""

    ark_key: rsa.RSAPrivateKey
    ark: bytes
    ask_key: rsa.RSAPrivateKey
    ask: bytes
    vcek_key: ec.EllipticCurvePrivateKey
    vcek: bytes
    product: str
    tcb: TcbVersion
    chip_id: bytes  # 64 bytes as the report holds it (Turin: 8 significant bytes, then zeros)


@dataclass(frozen=True, slots=True)
class ForgedSnp:
    evidence: SnpEvidence  # report + VCEK + ASK + ARK
    trust: SnpTrust  # the test ARK pinned: pass this to verify_snp
    chain: AmdTestChain
    auxblob: bytes  # the same certificates as a configfs-tsm certificate table


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Test Micro Devices"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def _der_int(value: int) -> bytes:
    content = value.to_bytes(1, "big") if value < 0x80 else b"\x00" + value.to_bytes(1, "big")
    return bytes([0x02, len(content)]) + content


def _ext(suffix: str, value: bytes) -> x509.UnrecognizedExtension:
    return x509.UnrecognizedExtension(x509.ObjectIdentifier(_AMD + suffix), value)


def _certificate(subject: str, issuer: str, key, signer, *, ca: bool, extensions=()) -> bytes:
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOT_BEFORE)
        .not_valid_after(NOT_AFTER)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    for ext in extensions:
        builder = builder.add_extension(ext, critical=False)
    cert = builder.sign(signer, hashes.SHA384(), rsa_padding=_PSS)
    return cert.public_bytes(serialization.Encoding.DER)


def _vcek_extensions(product: str, tcb: TcbVersion, chip_id: bytes, vlek: bool) -> list:
    line = ProductLine(product.split("-")[0])
    exts = [
        _ext("1", _der_int(1)),
        _ext("2", bytes([0x16, len(product)]) + product.encode()),
        _ext("3.1", _der_int(tcb.bootloader)),
        _ext("3.2", _der_int(tcb.tee)),
        _ext("3.3", _der_int(tcb.snp)),
        _ext("3.8", _der_int(tcb.microcode)),
    ]
    exts += [_ext(f"3.{i}", _der_int(0)) for i in ((5, 6, 7) if line.has_fmc else (4, 5, 6, 7))]
    if line.has_fmc:
        exts.append(_ext("3.9", _der_int(tcb.fmc or 0)))
    if vlek:
        exts.append(_ext("5", bytes([0x16, 8]) + b"test-csp"))
    else:
        exts.append(_ext("4", chip_id[:8] if line.has_fmc else chip_id))
    return exts


def make_amd_chain(
    product: str = "Milan-B0", tcb: TcbVersion = MILAN_TCB, chip_id: bytes | None = None, *, vlek: bool = False
) -> AmdTestChain:
    """A fresh test chain; `product` decides the TCB layout ("Turin..." has an FMC SVN)."""
    line = ProductLine(product.split("-")[0])
    if chip_id is None:
        chip_id = bytes(range(1, 9)) + bytes(56) if line.has_fmc else bytes(range(1, 65))
    ark_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ask_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    vcek_key = ec.generate_private_key(ec.SECP384R1())
    ark_cn, ask_cn = f"ARK-{line.value}", ("SEV-VLEK-" if vlek else "SEV-") + line.value
    ark = _certificate(ark_cn, ark_cn, ark_key, ark_key, ca=True)
    ask = _certificate(ask_cn, ark_cn, ask_key, ark_key, ca=True)
    vcek = _certificate(
        "SEV-VLEK" if vlek else "SEV-VCEK",
        ask_cn,
        vcek_key,
        ask_key,
        ca=False,
        extensions=_vcek_extensions(product, tcb, chip_id, vlek),
    )
    return AmdTestChain(ark_key, ark, ask_key, ask, vcek_key, vcek, product, tcb, chip_id)


@dataclass(frozen=True, slots=True)
class ReportFields:
    """The fields a test sets; everything else is zero. TCBs default to the chain's TCB."""

    report_data: bytes = bytes(64)
    measurement: bytes = bytes(48)
    version: int = 2
    policy: int = POLICY_DEFAULT
    vmpl: int = 0
    signer: int = 0  # KEY_INFO.SIGNING_KEY: 0 VCEK, 1 VLEK
    mask_chip_key: bool = False
    host_data: bytes = bytes(32)
    reported_tcb: TcbVersion | None = None
    cpuid: tuple[int, int, int] | None = None  # v3+: defaults to the chain's product line


_CPUID = {
    ProductLine.MILAN: (0x19, 0x01, 0x01),
    ProductLine.GENOA: (0x19, 0x11, 0x01),
    ProductLine.TURIN: (0x1A, 0x02, 0x00),
}


def build_report(chain: AmdTestChain, fields: ReportFields) -> bytes:
    """A report laid out per the SEV-SNP ABI and signed by the chain's VCEK."""
    line = ProductLine(chain.product.split("-")[0])
    tcb = encode_tcb(fields.reported_tcb or chain.tcb, line)
    body = bytearray(REPORT_SIZE)
    key_info = fields.signer << 2 | int(fields.mask_chip_key) << 1
    struct.pack_into("<IIQ", body, 0x00, fields.version, 0, fields.policy)
    struct.pack_into("<II", body, 0x30, fields.vmpl, 1)
    struct.pack_into("<QI", body, 0x40, 1, key_info)
    body[0x38:0x40] = body[0x180:0x188] = body[0x1E0:0x1E8] = body[0x1F0:0x1F8] = tcb
    body[0x50:0x90] = fields.report_data
    body[0x90:0xC0] = fields.measurement
    body[0xC0:0xE0] = fields.host_data
    if fields.version >= 3:
        body[0x188:0x18B] = bytes(fields.cpuid or _CPUID[line])
    body[0x1A0:0x1E0] = bytes(64) if fields.mask_chip_key else chain.chip_id
    body[0x1E8:0x1EB] = body[0x1EC:0x1EF] = bytes([7, 55, 1])  # build, minor, major
    return sign_report(bytes(body), chain.vcek_key)


def sign_report(report: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    """(Re)sign bytes [0, 0x2A0) of a report: r and s little-endian, 72 bytes each."""
    r, s = decode_dss_signature(key.sign(report[:SIGNED_SIZE], ec.ECDSA(hashes.SHA384())))
    return (
        report[:SIGNED_SIZE]
        + r.to_bytes(72, "little")
        + s.to_bytes(72, "little")
        + bytes(REPORT_SIZE - SIGNED_SIZE - 2 * 72)
    )


def forge_snp_evidence(
    report_data: bytes = bytes(64), measurement: bytes = bytes(48), *, chain: AmdTestChain | None = None, **fields
) -> ForgedSnp:
    """A complete, valid synthetic SNP evidence bundle and the test ARK to pin.

    `report_data` (64 bytes) and `measurement` (48 bytes) go into the report; any other
    `ReportFields` field can be set by keyword (e.g. `policy=POLICY_DEFAULT | POLICY_DEBUG`,
    `version=5`). Pass `chain` to reuse keys (RSA key generation is the slow part).
    """
    chain = chain or make_amd_chain()
    report = build_report(chain, replace(ReportFields(report_data, measurement), **fields))
    evidence = SnpEvidence(report=report, vcek=chain.vcek, ask=chain.ask, ark=chain.ark)
    is_vlek = fields.get("signer") == 1
    auxblob = build_cert_table(
        [(VLEK_GUID if is_vlek else VCEK_GUID, chain.vcek), (ASK_GUID, chain.ask), (ARK_GUID, chain.ark)]
    )
    return ForgedSnp(evidence=evidence, trust=SnpTrust(arks=(chain.ark,)), chain=chain, auxblob=auxblob)
