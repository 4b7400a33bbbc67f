"""NVIDIA GPU evidence through NVML (the `nvidia-ml-py` bindings, imported as `pynvml`), as NVIDIA's
own GPU verifier collects it: the SPDM measurement report for a 32-byte nonce and the GPU's
attestation certificate chain. It works only with the driver in confidential-computing mode.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from traceless.errors import InvalidRequestError
from traceless.privacy.attestation.collectors import Collector, CollectorError, Evidence, NoGpuAttestationError

NONCE_SIZE = 32


class NvmlCollector(Collector):
    """`nvml` is the pynvml module (imported on first use when None; tests pass a stand-in)."""

    def __init__(self, device_index: int = 0, *, nvml: ModuleType | Any | None = None) -> None:
        self._index = device_index
        self._nvml = nvml

    def collect(self, report_data: bytes) -> Evidence:
        if len(report_data) != NONCE_SIZE:
            raise InvalidRequestError(f"the GPU nonce is {len(report_data)} bytes, SPDM needs {NONCE_SIZE}")
        nvml = self._load()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise NoGpuAttestationError(f"NVML did not initialise ({e}): no NVIDIA GPU or driver") from None
        try:
            return self._collect(nvml, bytes(report_data))
        except nvml.NVMLError as e:
            raise CollectorError(f"NVML attestation call failed: {e}") from None
        finally:
            nvml.nvmlShutdown()

    def _load(self) -> Any:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError:
                raise NoGpuAttestationError(
                    "NVML Python bindings are not installed (pip install nvidia-ml-py)"
                ) from None
        return self._nvml

    def _collect(self, nvml: Any, nonce: bytes) -> Evidence:
        if nvml.nvmlSystemGetConfComputeState().ccFeature == 0:
            raise NoGpuAttestationError("the NVIDIA driver is not in confidential-computing mode")
        count = nvml.nvmlDeviceGetCount()
        if not 0 <= self._index < count:
            raise NoGpuAttestationError(f"no GPU at index {self._index} ({count} present)")
        handle = nvml.nvmlDeviceGetHandleByIndex(self._index)
        report = nvml.nvmlDeviceGetConfComputeGpuAttestationReport(handle, nonce)
        chain = nvml.nvmlDeviceGetConfComputeGpuCertificate(handle)
        blob = bytes(report.attestationReport[: report.attestationReportSize])
        pem = bytes(chain.attestationCertChain[: chain.attestationCertChainSize])
        if not blob or not pem:
            raise CollectorError("NVML returned an empty attestation report or certificate chain")
        return Evidence(kind="nvidia", blob=blob, aux=pem, provider="nvml")
