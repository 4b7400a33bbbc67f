"""An evidence policy (evidence_policy.AttestationPolicy) written as a JSON or YAML file, for
`traceless gateway --evidence-policy FILE` and `traceless proxy --evidence-policy FILE`.

    name: production                  # shown in status lines and reports (default: the file's stem)
    cpu: [snp, tdx]                   # accepted CPU TEE kinds: exactly one report must verify
    gpu: true                         # every GPU's NVIDIA report must verify (at least one)
    roots:                            # pinned vendor roots, paths relative to this file, PEM or DER
      snp: [ark-milan.pem, ark-genoa.pem]
      tdx: [intel-sgx-root.pem]
      nvidia: [nvidia-device-root.pem]
    snp:
      measurements: ['<96 hex digits>', ...]      # allowed launch measurements (required with snp; quoted)
      minimum_tcb: {bootloader: 3, tee: 0, snp: 8, microcode: 115}   # (fmc: on Turin)
      allow_smt: true
      allow_migration_agent: false
      max_vmpl: 3
      host_data: ['<64 hex digits>', ...]         # allowed HOST_DATA: the runtime policy's digest
    tdx:
      mr_td: ['<96 hex digits>', ...]             # allowed MRTDs (required with tdx)
      accepted_tcb_statuses: [UpToDate]
      collateral: pcs-collateral/                 # Intel PCS collateral directory (tdx_collateral.py)
      mr_config_id: ['<96 hex digits>', ...]      # allowed MRCONFIGID: the runtime policy's digest
    kata_initdata: [initdata.toml, ...]   # Kata initdata documents (agent policy inside): their
                                          # HOST_DATA and MRCONFIGID are allowed (runtime_policy.py)
    nvidia:
      reference: {0: ['<hex>', ...], ...}         # block index -> allowed measurement values
    development: true                 # allow the software attester (never in production)

Every key is checked: an unknown key, a wrong type, a missing root or a hardware kind without the
measurements it must pin is a `PolicyFileError` naming the section and the keys it allows, never a
silently ignored setting. With `host_data`, `mr_config_id` or `kata_initdata`, a CPU report whose
field is not among the allowed values is refused (`snp:host-data`, `tdx:mr-config-id`).
A file with only `development: true` is the development policy. Quote hex
values in YAML: unquoted, one made of digits only would be read as a number (and refused).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from traceless.errors import TracelessError
from traceless.privacy.attestation.evidence_policy import AttestationPolicy, HardwareTrust
from traceless.privacy.attestation.nvidia import NvidiaPolicy, NvidiaTrust
from traceless.privacy.attestation.runtime_policy import InitdataError, initdata_digest
from traceless.privacy.attestation.snp import SnpPolicy, SnpTrust
from traceless.privacy.attestation.snp_report import TcbVersion
from traceless.privacy.attestation.tdx import TdxPolicy, TdxTrust
from traceless.privacy.attestation.tdx_collateral import TdxCollateral

MAX_POLICY_BYTES = 1 << 20
_TOP = ("name", "cpu", "gpu", "roots", "snp", "tdx", "nvidia", "development", "kata_initdata")
_ROOTS = ("snp", "tdx", "nvidia")
_SNP = ("measurements", "minimum_tcb", "allow_smt", "allow_migration_agent", "max_vmpl", "host_data")
_TCB = ("bootloader", "tee", "snp", "microcode", "fmc")
_TDX = ("mr_td", "accepted_tcb_statuses", "collateral", "mr_config_id")
_NVIDIA = ("reference",)
_MEASUREMENT_SIZE = 48


class PolicyFileError(TracelessError):
    """The policy file cannot be read or does not describe a valid policy."""


def load_policy_file(path: str | Path) -> AttestationPolicy:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PolicyFileError(f"cannot read the evidence policy file {path}: {e.strerror}") from None
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyFileError(f"the evidence policy file is larger than {MAX_POLICY_BYTES} bytes")
    return parse_policy(_decode(data, path.suffix.lower()), path.parent, default_name=path.stem)


def _decode(data: bytes, suffix: str) -> object:
    try:
        if suffix == ".json":
            return json.loads(data)
        return yaml.safe_load(data)
    except (ValueError, yaml.YAMLError):
        raise PolicyFileError("the evidence policy file is not valid JSON or YAML") from None


def parse_policy(doc: object, base: Path, default_name: str = "policy") -> AttestationPolicy:
    """The policy a decoded file describes; relative paths are read from `base`."""
    top = _section(doc, "the policy file", _TOP)
    development = _bool(top, "development", False, "the policy file")
    cpu = _str_list(top.get("cpu", []), "cpu", allowed=("snp", "tdx"))
    gpu = _bool(top, "gpu", False, "the policy file")
    roots = _section(top.get("roots", {}), "roots", _ROOTS)
    trust = HardwareTrust(
        snp=SnpTrust(arks=_files(roots["snp"], base, "roots.snp")) if "snp" in roots else None,
        tdx=TdxTrust(roots=_files(roots["tdx"], base, "roots.tdx")) if "tdx" in roots else None,
        nvidia=NvidiaTrust(roots=_files(roots["nvidia"], base, "roots.nvidia")) if "nvidia" in roots else None,
    )
    snp = _snp(_section(top.get("snp", {}), "snp", _SNP))
    tdx_section = _section(top.get("tdx", {}), "tdx", _TDX)
    tdx = TdxPolicy(
        mr_td=_measurements(tdx_section["mr_td"], "tdx.mr_td") if "mr_td" in tdx_section else None,
        accepted_tcb_statuses=frozenset(
            _str_list(tdx_section.get("accepted_tcb_statuses", ["UpToDate"]), "tdx.accepted_tcb_statuses")
        ),
    )
    collateral = _collateral(tdx_section, base)
    nvidia = _nvidia(_section(top.get("nvidia", {}), "nvidia", _NVIDIA))
    host_data, mr_config_id = _runtime_policy(top, base)
    name = top.get("name", default_name)
    if not isinstance(name, str) or not name or not name.isprintable() or len(name) > 64:
        raise PolicyFileError("name must be a printable string of 1 to 64 characters")
    try:
        return AttestationPolicy(
            name,
            cpu=frozenset(cpu),
            gpu=gpu,
            allow_software=development,
            trust=trust,
            snp=snp,
            tdx=tdx,
            tdx_collateral=collateral,
            nvidia=nvidia,
            host_data=host_data,
            mr_config_id=mr_config_id,
        )
    except ValueError as e:
        raise PolicyFileError(f"the evidence policy is incomplete: {e}") from None


def _runtime_policy(top: Mapping[str, Any], base: Path) -> tuple[frozenset[bytes] | None, frozenset[bytes] | None]:
    """The allowed HOST_DATA and MRCONFIGID values: listed, and those of the named initdata files."""
    snp, tdx = top.get("snp", {}), top.get("tdx", {})
    host_data = set(_hex_list(snp["host_data"], "snp.host_data", 32)) if "host_data" in snp else None
    mr_config_id = set(_hex_list(tdx["mr_config_id"], "tdx.mr_config_id", 48)) if "mr_config_id" in tdx else None
    if "kata_initdata" in top:
        documents = _files(top["kata_initdata"], base, "kata_initdata")
        try:
            host_data = (host_data or set()) | {initdata_digest(d, "snp") for d in documents}
            mr_config_id = (mr_config_id or set()) | {initdata_digest(d, "tdx") for d in documents}
        except InitdataError as e:
            raise PolicyFileError(f"kata_initdata: {e}") from None
    return (
        None if host_data is None else frozenset(host_data),
        None if mr_config_id is None else frozenset(mr_config_id),
    )


def _section(value: object, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise PolicyFileError(f"{where} must be a mapping")
    if not set(value) <= set(allowed):
        raise PolicyFileError(f"{where} has a key that is not one of {', '.join(allowed)}")
    return value


def _bool(section: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise PolicyFileError(f"{key} in {where} must be true or false")
    return value


def _int(value: object, where: str) -> int:
    if type(value) is not int or value < 0:
        raise PolicyFileError(f"{where} must be a non-negative integer")
    return value


def _str_list(value: object, where: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyFileError(f"{where} must be a list of strings")
    if allowed is not None and not set(value) <= set(allowed):
        raise PolicyFileError(f"{where} may list only {', '.join(allowed)}")
    return value


def _files(value: object, base: Path, where: str) -> tuple[bytes, ...]:
    names = _str_list(value, where)
    if not names:
        raise PolicyFileError(f"{where} must name at least one certificate file")
    out = []
    for name in names:
        try:
            out.append((base / name).read_bytes())
        except OSError as e:
            raise PolicyFileError(f"{where}: cannot read a certificate file ({e.strerror})") from None
    return tuple(out)


def _hex(value: object, where: str, size: int | None = None) -> bytes:
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else None
    except ValueError:
        raw = None
    if raw is None or (size is not None and len(raw) != size):
        raise PolicyFileError(f"{where} must hold hex strings" + (f" of {size} bytes" if size else ""))
    return raw


def _measurements(value: object, where: str) -> frozenset[bytes]:
    if not isinstance(value, list):
        raise PolicyFileError(f"{where} must be a list of hex strings")
    return frozenset(_hex(v, where, _MEASUREMENT_SIZE) for v in value)


def _hex_list(value: object, where: str, size: int) -> list[bytes]:
    if not isinstance(value, list) or not value:
        raise PolicyFileError(f"{where} must be a non-empty list of hex strings")
    return [_hex(v, where, size) for v in value]


def _snp(section: Mapping[str, Any]) -> SnpPolicy:
    tcb = None
    if "minimum_tcb" in section:
        fields = _section(section["minimum_tcb"], "snp.minimum_tcb", _TCB)
        if not {"bootloader", "tee", "snp", "microcode"} <= set(fields):
            raise PolicyFileError("snp.minimum_tcb needs bootloader, tee, snp and microcode")
        values = {k: _int(v, f"snp.minimum_tcb.{k}") for k, v in fields.items()}
        tcb = TcbVersion(**values)
    measurements = _measurements(section["measurements"], "snp.measurements") if "measurements" in section else None
    return SnpPolicy(
        minimum_tcb=tcb,
        measurements=measurements,
        allow_migration_agent=_bool(section, "allow_migration_agent", False, "snp"),
        allow_smt=_bool(section, "allow_smt", True, "snp"),
        max_vmpl=_int(section.get("max_vmpl", 3), "snp.max_vmpl"),
    )


def _collateral(section: Mapping[str, Any], base: Path) -> TdxCollateral | None:
    if "collateral" not in section:
        return None
    if not isinstance(section["collateral"], str):
        raise PolicyFileError("tdx.collateral must be a directory path")
    try:
        return TdxCollateral.from_dir(base / section["collateral"])
    except (OSError, TracelessError) as e:
        raise PolicyFileError(f"tdx.collateral: {e}") from None


def _nvidia(section: Mapping[str, Any]) -> NvidiaPolicy:
    if "reference" not in section:
        return NvidiaPolicy()
    table = section["reference"]
    if not isinstance(table, dict):
        raise PolicyFileError("nvidia.reference must map block indexes to lists of hex values")
    out = {}
    for index, values in table.items():
        if not str(index).isdigit() or not isinstance(values, list):
            raise PolicyFileError("nvidia.reference must map block indexes to lists of hex values")
        out[int(index)] = frozenset(_hex(v, "nvidia.reference") for v in values)
    return NvidiaPolicy(reference=out)
