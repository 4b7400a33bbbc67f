from pathlib import Path

import pytest


@pytest.fixture
def record_mkdtemp(tmp_path, monkeypatch):
    """record_mkdtemp(module): the module's tempfile.mkdtemp makes its directories under tmp_path
    and lists them, so a test can check that they were removed."""
    def patch(module) -> list[Path]:
        made: list[Path] = []
        real = module.tempfile.mkdtemp

        def mkdtemp(**kw):
            made.append(Path(real(dir=tmp_path, **kw)))
            return str(made[-1])

        monkeypatch.setattr(module.tempfile, "mkdtemp", mkdtemp)
        return made
    return patch
