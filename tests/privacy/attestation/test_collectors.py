"""Node-side collectors: configfs-tsm against a fake configfs tree that plays the kernel's part,
NVML against a stand-in module and against the absent library. Evidence they return goes
through the client's verifiers."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.privacy.attestation.forge import forge_snp_evidence
from tests.vectors import vector_path
from traceless.errors import InvalidRequestError
from traceless.privacy.attestation.collectors import (
    CollectorError,
    CollectorUnavailableError,
    EvidenceRaceError,
    NoGpuAttestationError,
    NoTsmError,
)
from traceless.privacy.attestation.nvidia import NvidiaEvidence, NvidiaTrust, verify_nvidia
from traceless.privacy.attestation.nvml import NvmlCollector
from traceless.privacy.attestation.snp import SnpEvidence, verify_snp
from traceless.privacy.attestation.tsm import ConfigFs, TsmCollector

REPORT_DATA = bytes(range(64))


class FakeConfigFs(ConfigFs):
    """An ordinary directory standing in for configfs: `create` fills a new entry with the attribute
    files the kernel would, `write` bumps `generation` the way the kernel does (by `bump` per write)."""

    def __init__(self, provider: str, outblob: bytes, auxblob: bytes | None = None, bump: int = 1) -> None:
        self.provider, self.outblob, self.auxblob, self.bump = provider, outblob, auxblob, bump
        self.written: dict[str, bytes] = {}
        self.created: list[Path] = []

    def create(self, entry: Path) -> None:
        super().create(entry)
        self.created.append(entry)
        (entry / "provider").write_text(self.provider + "\n")
        (entry / "generation").write_text("0\n")
        (entry / "outblob").write_bytes(self.outblob)
        if self.auxblob is not None:
            (entry / "auxblob").write_bytes(self.auxblob)

    def write(self, attribute: Path, data: bytes) -> None:
        super().write(attribute, data)
        self.written[attribute.name] = data
        generation = attribute.parent / "generation"
        generation.write_text(f"{int(generation.read_text()) + self.bump}\n")

    def remove(self, entry: Path) -> None:
        for child in entry.iterdir():
            child.unlink()
        super().remove(entry)


@pytest.fixture
def root(tmp_path) -> Path:
    path = tmp_path / "tsm" / "report"
    path.mkdir(parents=True)
    return path


def test_snp_evidence_from_configfs_verifies_and_binds_the_report_data(root):
    forged = forge_snp_evidence(report_data=REPORT_DATA)
    fs = FakeConfigFs("sev_guest", forged.evidence.report, forged.auxblob)
    evidence = TsmCollector(root, configfs=fs).collect(REPORT_DATA)
    assert (evidence.kind, evidence.provider, evidence.blob, evidence.aux) == (
        "snp",
        "sev_guest",
        forged.evidence.report,
        forged.auxblob,
    )
    assert fs.written == {"inblob": REPORT_DATA}
    assert list(root.iterdir()) == [] and fs.created[0].parent == root  # the entry is gone afterwards
    result = verify_snp(SnpEvidence.from_extended(evidence.blob, evidence.aux), forged.trust, report_data=REPORT_DATA)
    assert result.ok


def test_tdx_provider_and_privlevel(root):
    fs = FakeConfigFs("tdx_guest", b"quote-bytes")
    evidence = TsmCollector(root, privlevel=2, configfs=fs).collect(REPORT_DATA)
    assert (evidence.kind, evidence.blob, evidence.aux) == ("tdx", b"quote-bytes", b"")
    assert fs.written == {"privlevel": b"2", "inblob": REPORT_DATA}


def test_a_concurrent_writer_is_detected_and_the_entry_still_removed(root):
    fs = FakeConfigFs("sev_guest", b"report", bump=2)
    with pytest.raises(EvidenceRaceError, match="generation went 0 -> 2"):
        TsmCollector(root, configfs=fs).collect(REPORT_DATA)
    assert list(root.iterdir()) == []


def test_machines_without_configfs_tsm_or_with_another_provider_fail_clearly(tmp_path, root):
    with pytest.raises(NoTsmError, match="no configfs-tsm report interface"):
        TsmCollector(tmp_path / "absent").collect(REPORT_DATA)
    with pytest.raises(CollectorError, match="provider 'arm_cca'"):
        TsmCollector(root, configfs=FakeConfigFs("arm_cca", b"x")).collect(REPORT_DATA)
    with pytest.raises(InvalidRequestError, match="64"):
        TsmCollector(root).collect(b"short")
    with pytest.raises(CollectorError, match="empty report"):
        TsmCollector(root, configfs=FakeConfigFs("sev_guest", b"")).collect(REPORT_DATA)


def test_a_generation_that_is_not_a_number_is_refused(root):
    class Garbled(FakeConfigFs):
        def create(self, entry: Path) -> None:
            super().create(entry)
            (entry / "generation").write_text("busy\n")

    with pytest.raises(CollectorError, match="generation is not a number"):
        TsmCollector(root, configfs=Garbled("sev_guest", b"report")).collect(REPORT_DATA)
    assert list(root.iterdir()) == []


def test_a_plain_directory_is_not_mistaken_for_configfs(root):
    # mkdir on a real filesystem creates no attribute files: reading `provider` fails, cleanly.
    with pytest.raises(CollectorError, match="ENOENT on provider"):
        TsmCollector(root).collect(REPORT_DATA)
    assert list(root.iterdir()) == []


def test_nvml_collector_without_the_library_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(NoGpuAttestationError, match="nvidia-ml-py"):
        NvmlCollector().collect(bytes(32))
    assert issubclass(NoGpuAttestationError, CollectorUnavailableError)


class FakeNvml:
    """The part of pynvml the collector uses, returning NVIDIA's sample report and chain."""

    NVMLError = type("NVMLError", (Exception,), {})

    def __init__(self, cc: int = 1, init_error: bool = False) -> None:
        self.cc, self.init_error, self.shut_down = cc, init_error, False
        self.report = bytes.fromhex(vector_path("attestation/nvidia-h100/hopperAttestationReport.txt").read_text())
        self.chain = vector_path("attestation/nvidia-h100/hopperCertChain.txt").read_bytes()
        self.nonces: list[bytes] = []

    def nvmlInit(self):
        if self.init_error:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlSystemGetConfComputeState(self):
        return SimpleNamespace(ccFeature=self.cc)

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetConfComputeGpuAttestationReport(self, handle, nonce):
        self.nonces.append(nonce)
        return SimpleNamespace(attestationReport=list(self.report) + [0] * 64, attestationReportSize=len(self.report))

    def nvmlDeviceGetConfComputeGpuCertificate(self, handle):
        return SimpleNamespace(
            attestationCertChain=list(self.chain) + [0] * 64, attestationCertChainSize=len(self.chain)
        )


def test_nvml_collector_returns_report_and_chain_that_verify():
    nvml = FakeNvml()
    nonce = bytes.fromhex("931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb")
    evidence = NvmlCollector(nvml=nvml).collect(nonce)
    assert nvml.nonces == [nonce] and nvml.shut_down and (evidence.kind, evidence.provider) == ("nvidia", "nvml")
    trust = NvidiaTrust(roots=(vector_path("attestation/nvidia-h100/verifier_device_root.pem").read_bytes(),))
    assert verify_nvidia(NvidiaEvidence(evidence.blob, evidence.aux), trust, nonce=nonce).ok


def test_nvml_collector_fails_clearly_without_driver_gpu_or_cc_mode():
    with pytest.raises(NoGpuAttestationError, match="did not initialise"):
        NvmlCollector(nvml=FakeNvml(init_error=True)).collect(bytes(32))
    off = FakeNvml(cc=0)
    with pytest.raises(NoGpuAttestationError, match="confidential-computing mode"):
        NvmlCollector(nvml=off).collect(bytes(32))
    assert off.shut_down
    with pytest.raises(NoGpuAttestationError, match="no GPU at index 3"):
        NvmlCollector(3, nvml=FakeNvml()).collect(bytes(32))
    with pytest.raises(InvalidRequestError, match="32"):
        NvmlCollector(nvml=FakeNvml()).collect(bytes(64))
