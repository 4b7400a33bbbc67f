"""The audit tools' helper that runs `traceless serve`: its temporary work directory goes with it."""

import httpx

from traceless_tools.local import services


def test_spawn_serve_removes_the_temporary_directory_it_made(tiny_llama_dir, record_mkdtemp):
    made = record_mkdtemp(services)
    with services.spawn_serve(
        "--model", str(tiny_llama_dir), "--dtype", "float32", "--kv-cache-memory", "64MiB"
    ) as svc:
        assert httpx.get(svc.url + "/health", timeout=10).status_code == 200
        assert svc.log_path.parent == made[0] and svc.log_path.exists()
    assert not made[0].exists()


def test_spawn_serve_keeps_a_directory_it_was_given(tmp_path, tiny_llama_dir):
    with services.spawn_serve(
        "--model",
        str(tiny_llama_dir),
        "--dtype",
        "float32",
        "--kv-cache-memory",
        "64MiB",
        name="kept",
        workdir=tmp_path,
    ) as svc:
        assert httpx.get(svc.url + "/health", timeout=10).status_code == 200
    assert (tmp_path / "kept.log").exists()
