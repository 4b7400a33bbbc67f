"""A confidential VM and GPU for tests: the kernel's configfs-tsm and NVIDIA's NVML played by
fakes whose "hardware" is the test AMD chain (tests/privacy/attestation/forge.py) and the test GPU
chain (forge_nvidia.py). Evidence goes through the real collectors (TsmCollector, NvmlCollector)
and binds whatever the node asks for, as real hardware would."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.privacy.attestation.forge import AmdTestChain, forge_snp_evidence
from tests.privacy.attestation.forge_nvidia import GpuTestChain
from traceless.privacy.attestation.hardware import HardwareAttester
from traceless.privacy.attestation.nvml import NvmlCollector
from traceless.privacy.attestation.tsm import ConfigFs, TsmCollector

LAUNCH = bytes(range(48))  # the launch measurement of the test "image"


class SnpGuestConfigFs(ConfigFs):
    """configfs-tsm of an SEV-SNP guest: an entry gets `provider` and `generation`; writing `inblob`
    makes `outblob` a report carrying it, signed by the test VCEK, and `auxblob` its certificate table."""

    def __init__(self, chain: AmdTestChain, launch: bytes = LAUNCH) -> None:
        self.chain, self.launch = chain, launch
        self.reports = 0

    def create(self, entry: Path) -> None:
        super().create(entry)
        (entry / "provider").write_text("sev_guest\n")
        (entry / "generation").write_text("0\n")

    def write(self, attribute: Path, data: bytes) -> None:
        super().write(attribute, data)
        generation = attribute.parent / "generation"
        generation.write_text(f"{int(generation.read_text()) + 1}\n")
        if attribute.name == "inblob":
            forged = forge_snp_evidence(data, self.launch, chain=self.chain)
            (attribute.parent / "outblob").write_bytes(forged.evidence.report)
            (attribute.parent / "auxblob").write_bytes(forged.auxblob)
            self.reports += 1

    def remove(self, entry: Path) -> None:
        for child in entry.iterdir():
            child.unlink()
        super().remove(entry)


class CcGpuNvml:
    """The part of pynvml NvmlCollector uses, for one GPU in confidential-computing mode whose
    attestation key is the test GPU chain's: the report answers the nonce asked for."""

    NVMLError = type("NVMLError", (Exception,), {})

    def __init__(self, chain: GpuTestChain) -> None:
        self.chain = chain

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlSystemGetConfComputeState(self):
        return SimpleNamespace(ccFeature=1)

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int):
        return ("gpu", index)

    def nvmlDeviceGetConfComputeGpuAttestationReport(self, handle, nonce: bytes):
        report = self.chain.evidence(bytes(nonce)).report
        return SimpleNamespace(attestationReport=list(report), attestationReportSize=len(report))

    def nvmlDeviceGetConfComputeGpuCertificate(self, handle):
        return SimpleNamespace(
            attestationCertChain=list(self.chain.pem_chain), attestationCertChainSize=len(self.chain.pem_chain)
        )


def hardware_attester(tsm_root: Path, amd: AmdTestChain, gpu: GpuTestChain | None) -> HardwareAttester:
    """A HardwareAttester over the real collectors, on the fake configfs tree and NVML."""
    tsm_root.mkdir(parents=True, exist_ok=True)
    gpus = [NvmlCollector(0, nvml=CcGpuNvml(gpu))] if gpu is not None else []
    return HardwareAttester(TsmCollector(tsm_root, configfs=SnpGuestConfigFs(amd)), gpus)


def write_policy_file(
    directory: Path, amd: AmdTestChain, gpu: GpuTestChain | None, *, name: str = "test", launch: bytes = LAUNCH
) -> Path:
    """A YAML evidence policy pinning the test roots (written beside it) and the test launch measurement."""
    (directory / "test-ark.der").write_bytes(amd.ark)
    lines = [
        f"name: {name}",
        "cpu: [snp]",
        f"gpu: {'true' if gpu is not None else 'false'}",
        "roots:",
        "  snp: [test-ark.der]",
    ]
    if gpu is not None:
        (directory / "test-gpu-root.pem").write_bytes(gpu.trust.roots[0])
        lines.append("  nvidia: [test-gpu-root.pem]")
    lines += [
        "snp:",
        f"  measurements: ['{launch.hex()}']",
        "  minimum_tcb: {bootloader: 0, tee: 0, snp: 0, microcode: 0}",
    ]
    path = directory / f"{name}-policy.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path
