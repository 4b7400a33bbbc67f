"""`traceless node --attestation software|hardware [--gpu-evidence N]`: the hardware attester is built
from the real collectors and probed before the model loads, so a machine without a confidential VM
fails at once with a clear error and a non-zero exit; the attestation kind is measured."""

from __future__ import annotations

import pytest

import traceless_tools.cli as cli
from tests.privacy.attestation.fake_hardware import CcGpuNvml
from tests.privacy.attestation.forge_nvidia import GpuTestChain
from traceless.cli.node import MAX_GPUS, build_attester, node_measured_config, node_parser
from traceless.privacy.attestation import hardware
from traceless.privacy.attestation.hardware import HardwareAttester
from traceless.privacy.attestation.software import SoftwareAttester
from traceless.privacy.attestation.tsm import TSM_REPORT_ROOT


def _args(*argv: str):
    return node_parser().parse_args(["--model", "/nonexistent/model", *argv])


def test_software_is_the_default_and_takes_no_gpu_evidence():
    assert isinstance(build_attester(_args()), SoftwareAttester)
    with pytest.raises(SystemExit, match="--gpu-evidence needs --attestation hardware"):
        build_attester(_args("--gpu-evidence", "1"))
    with pytest.raises(SystemExit, match=f"--gpu-evidence must be 0 to {MAX_GPUS}"):
        build_attester(_args("--attestation", "hardware", "--gpu-evidence", str(MAX_GPUS + 1)))
    assert MAX_GPUS == hardware.MAX_GPUS and hardware.MAX_EVIDENCE_ITEMS == 1 + MAX_GPUS


def test_a_kept_attester_key_survives_a_restart_and_nothing_else_does(tmp_path):
    """--attester-key-file: the same signing key after a restart (what a client pins), created 0600 on
    the first start; the OHTTP keys of two starts still differ."""
    from traceless.node.identity import NodeIdentity
    from traceless.privacy.attestation.measurement import Measurement

    path = tmp_path / "node0" / "attester.key"
    first = build_attester(_args("--attester-key-file", str(path)))
    assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_bytes()) == 32
    second = build_attester(_args("--attester-key-file", str(path)))
    raw = [a.public_key.public_bytes_raw() for a in (first, second)]
    assert raw[0] == raw[1] != build_attester(_args()).public_key.public_bytes_raw()
    m = Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32)
    assert NodeIdentity(first, m).ohttp_keys() != NodeIdentity(second, m).ohttp_keys()


def test_an_attester_key_file_others_can_read_or_of_the_wrong_size_is_refused(tmp_path):
    path = tmp_path / "attester.key"
    path.write_bytes(bytes(32))
    path.chmod(0o644)
    with pytest.raises(SystemExit, match="readable or writable by others"):
        build_attester(_args("--attester-key-file", str(path)))
    path.chmod(0o600)
    path.write_bytes(bytes(31))
    with pytest.raises(SystemExit, match="must hold 32 raw bytes"):
        build_attester(_args("--attester-key-file", str(path)))
    with pytest.raises(SystemExit, match="is for --attestation software"):
        build_attester(_args("--attestation", "hardware", "--attester-key-file", str(path)))


@pytest.mark.skipif(TSM_REPORT_ROOT.is_dir(), reason="this machine is a confidential VM with configfs-tsm")
def test_hardware_on_a_machine_without_the_device_exits_before_the_model_loads(monkeypatch, capsys):
    import traceless.cli.serve as serve

    def no_model(args):
        raise AssertionError("the model must not load before the attester is probed")

    monkeypatch.setattr(serve, "build_async_engine", no_model)
    assert cli.main(["node", "--attestation", "hardware", "--model", "/nonexistent/model"]) == 2
    message = capsys.readouterr().err
    assert message.startswith("traceless node: --attestation hardware cannot collect evidence on this machine")
    assert "no configfs-tsm report interface at /sys/kernel/config/tsm/report" in message
    assert "SEV-SNP or TDX guest" in message


def test_hardware_fails_clearly_on_a_directory_that_is_not_configfs_or_without_gpu_cc_mode(tmp_path):
    plain = tmp_path / "report"
    plain.mkdir()
    with pytest.raises(SystemExit, match="cannot collect evidence on this machine: configfs-tsm report failed"):
        build_attester(_args("--attestation", "hardware"), tsm_root=plain)
    assert list(plain.iterdir()) == []  # the probe's entry is removed


def test_a_gpu_without_confidential_computing_mode_is_refused_at_start(tmp_path, monkeypatch):
    """The CPU probe passes (collector replaced), the GPU's NVML says CC is off: a clear exit."""
    monkeypatch.setattr(HardwareAttester, "probe", _probe_gpus_only)
    nvml = CcGpuNvml(GpuTestChain())
    nvml.nvmlSystemGetConfComputeState = lambda: type("State", (), {"ccFeature": 0})()
    with pytest.raises(SystemExit, match="not in confidential-computing mode"):
        build_attester(_args("--attestation", "hardware", "--gpu-evidence", "1"), tsm_root=tmp_path, nvml=nvml)
    attester = build_attester(
        _args("--attestation", "hardware", "--gpu-evidence", "1"), tsm_root=tmp_path, nvml=CcGpuNvml(GpuTestChain())
    )
    assert isinstance(attester, HardwareAttester) and attester.attester_type == "hardware"


def _probe_gpus_only(self: HardwareAttester) -> None:
    for gpu in self._gpus:
        gpu.collect(bytes(32))


def test_the_attestation_kind_is_part_of_the_measured_configuration():
    software, hard = node_measured_config(_args()), node_measured_config(_args("--attestation", "hardware"))
    gpus = node_measured_config(_args("--attestation", "hardware", "--gpu-evidence", "2"))
    assert (software["attestation"], hard["attestation"], gpus["gpu_evidence"]) == ("software", "hardware", 2)
    assert len({repr(sorted(c.items())) for c in (software, hard, gpus)}) == 3
