"""SEV-SNP and TDX evidence through Linux's configfs-tsm report interface (Linux 6.7+,
Documentation/ABI/testing/configfs-tsm-report).

    mkdir <root>/<entry>        the kernel creates the entry's attribute files
    provider                    "sev_guest" (SEV-SNP) or "tdx_guest" (TDX)
    generation                  counts writes to the entry's attributes
    privlevel (optional)        SEV-SNP VMPL to request the report for
    inblob   <- 64 bytes        REPORT_DATA
    outblob  -> report          SEV-SNP ATTESTATION_REPORT / TDX quote (generated on read)
    auxblob  -> cert table      SEV-SNP only: the host's VCEK/ASK/ARK certificate table
    rmdir <root>/<entry>

A private entry per request (random name, mode 0700) keeps other processes from mixing their
REPORT_DATA into ours; the generation count read before the first write and after the last read
must differ by exactly our writes, which detects a writer that found the entry anyway.
"""

from __future__ import annotations

import errno
import secrets
from pathlib import Path

from traceless.errors import InvalidRequestError
from traceless.privacy.attestation.collectors import (
    Collector,
    CollectorError,
    Evidence,
    EvidenceRaceError,
    NoTsmError,
)

TSM_REPORT_ROOT = Path("/sys/kernel/config/tsm/report")
PROVIDERS = {"sev_guest": "snp", "tdx_guest": "tdx"}
REPORT_DATA_SIZE = 64


class ConfigFs:
    """The three operations whose effects the kernel supplies: creating an entry (which fills it
    with attribute files), writing an attribute (which bumps `generation`), removing an entry.
    Tests substitute a fake that plays the kernel's part on an ordinary directory."""

    def create(self, entry: Path) -> None:
        entry.mkdir(mode=0o700)

    def write(self, attribute: Path, data: bytes) -> None:
        attribute.write_bytes(data)

    def remove(self, entry: Path) -> None:
        entry.rmdir()


class TsmCollector(Collector):
    def __init__(
        self, root: Path = TSM_REPORT_ROOT, *, privlevel: int | None = None, configfs: ConfigFs | None = None
    ) -> None:
        self._root = root
        self._privlevel = privlevel
        self._fs = configfs or ConfigFs()

    def collect(self, report_data: bytes) -> Evidence:
        if len(report_data) != REPORT_DATA_SIZE:
            raise InvalidRequestError(f"report_data is {len(report_data)} bytes, configfs-tsm needs {REPORT_DATA_SIZE}")
        if not self._root.is_dir():
            raise NoTsmError(
                f"no configfs-tsm report interface at {self._root} (needs a Linux 6.7+ SEV-SNP or "
                "TDX guest with configfs mounted)"
            )
        entry = self._root / f"traceless-{secrets.token_hex(8)}"
        try:
            self._fs.create(entry)
        except OSError as e:
            raise CollectorError(
                f"cannot create a report entry under {self._root}: {errno.errorcode.get(e.errno or 0, 'error')}"
            ) from None
        try:
            return self._generate(entry, bytes(report_data))
        except OSError as e:
            raise CollectorError(
                f"configfs-tsm report failed: {errno.errorcode.get(e.errno or 0, 'error')} "
                f"on {Path(e.filename or '').name or 'entry'}"
            ) from None
        finally:
            try:
                self._fs.remove(entry)
            except OSError:
                pass  # the entry holds nothing secret; a failed rmdir leaves an empty configfs item

    def _generate(self, entry: Path, report_data: bytes) -> Evidence:
        provider = (entry / "provider").read_bytes().decode("ascii", "replace").strip()
        kind = PROVIDERS.get(provider)
        if kind is None:
            raise CollectorError(f"configfs-tsm provider {provider!r} is not SEV-SNP or TDX")
        before = _generation(entry)
        writes = 0
        if self._privlevel is not None:
            self._fs.write(entry / "privlevel", str(self._privlevel).encode())
            writes += 1
        self._fs.write(entry / "inblob", report_data)
        writes += 1
        blob = (entry / "outblob").read_bytes()
        aux = (entry / "auxblob").read_bytes() if kind == "snp" and (entry / "auxblob").exists() else b""
        after = _generation(entry)
        if after != before + writes:
            raise EvidenceRaceError(
                f"report entry generation went {before} -> {after} over {writes} writes: "
                "another writer changed the request"
            )
        if not blob:
            raise CollectorError("configfs-tsm returned an empty report")
        return Evidence(kind=kind, blob=blob, aux=aux, provider=provider)


def _generation(entry: Path) -> int:
    text = (entry / "generation").read_text().strip()
    if not text.isdigit():
        raise CollectorError("configfs-tsm generation is not a number")
    return int(text)
