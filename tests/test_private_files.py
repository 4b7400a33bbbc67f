"""write_private: secrets on disk are 0600 whatever the umask, and replaced atomically."""

import os
import stat

from traceless.private_files import write_private


def test_written_0600_under_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        write_private(tmp_path / "endpoints.json", '{"api_key": "k"}')
    finally:
        os.umask(old)
    path = tmp_path / "endpoints.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == '{"api_key": "k"}'


def test_an_existing_world_readable_file_is_replaced_private(tmp_path):
    path = tmp_path / "api-key"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, b"new")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["api-key"]  # no temporary left behind
