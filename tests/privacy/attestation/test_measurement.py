"""The measurement changes when any code file, the weights or the configuration changes, and
only then; the combination follows the documented encoding."""

import hashlib
import shutil

import pytest

from traceless.errors import InvalidRequestError, ModelNotFoundError
from traceless.privacy.attestation.measurement import (
    Measurement,
    code_digest,
    code_files,
    combine,
    config_digest,
    measure,
    model_digest,
    package_root,
)


@pytest.fixture
def package(tmp_path):
    root = tmp_path / "traceless"
    shutil.copytree(package_root(), root, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return root


def _lp(b):
    return len(b).to_bytes(4, "big") + b


def test_code_digest_follows_the_documented_encoding(package):
    files = code_files(package)
    paths = [p for p, _ in files]
    assert "privacy/attestation/measurement.py" in paths and "model/layers/csrc/kernels.c" in paths
    assert paths == sorted(paths) and not any(p.endswith((".so", ".pyc")) for p in paths)
    want = hashlib.sha256(
        _lp(b"traceless/measurement/code/v1")
        + b"".join(_lp(p.encode()) + hashlib.sha256((package / p).read_bytes()).digest() for p in paths)
    )
    assert code_digest(package) == want.digest()
    assert code_digest(package) == code_digest()  # the copy measures like the installed package


@pytest.mark.parametrize("change", ["edit_py", "edit_c", "add_py", "rename_py", "delete_py"])
def test_any_code_change_changes_the_code_digest(package, change):
    before = code_digest(package)
    target = package / "privacy" / "translog" / "merkle.py"
    if change == "edit_py":
        target.write_bytes(target.read_bytes() + b"\n")
    elif change == "edit_c":
        kernel = package / "model" / "layers" / "csrc" / "kernels.c"
        kernel.write_bytes(kernel.read_bytes().replace(b"0", b"1", 1))
    elif change == "add_py":
        (package / "privacy" / "backdoor.py").write_text("")
    elif change == "rename_py":
        target.rename(package / "privacy" / "translog" / "merkle2.py")
    else:
        target.unlink()
    assert code_digest(package) != before


def test_build_artifacts_do_not_change_the_code_digest(package):
    before = code_digest(package)
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\x00" * 16)
    (package / "model" / "layers" / "libkernels.so").write_bytes(b"\x7fELF")
    assert code_digest(package) == before


def test_model_file_and_directory(tmp_path):
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"GGUF" + bytes(100))
    assert model_digest(weights) == hashlib.sha256(weights.read_bytes()).digest()
    before = model_digest(weights)
    weights.write_bytes(b"GGUF" + bytes(99) + b"\x01")
    assert model_digest(weights) != before

    directory = tmp_path / "hf"
    directory.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        (directory / name).write_text(name)
    before = model_digest(directory)
    (directory / "README.md").write_text("docs are not weights")
    (directory / ".cache").mkdir()
    (directory / ".cache" / "x.json").write_text("{}")
    assert model_digest(directory) == before
    (directory / "config.json").write_text('{"layers": 2}')
    assert model_digest(directory) != before
    with pytest.raises(ModelNotFoundError):
        model_digest(tmp_path / "missing")


def test_config_digest_is_canonical():
    a = config_digest({"b": 1, "a": [1, 2], "name": "é"})
    assert a == config_digest({"name": "é", "a": [1, 2], "b": 1})
    assert a == hashlib.sha256('{"a":[1,2],"b":1,"name":"é"}'.encode()).digest()
    assert a != config_digest({"b": 2, "a": [1, 2], "name": "é"})
    for bad in ([1, 2], {"x": float("nan")}, {"x": object()}):
        with pytest.raises(InvalidRequestError):
            config_digest(bad)


def test_combined_changes_with_each_component(tmp_path):
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"weights")
    m = measure(weights, {"max_batch": 8})
    assert m.code == code_digest() and m.model == hashlib.sha256(b"weights").digest()
    want = hashlib.sha256(
        _lp(b"traceless/measurement/v1") + _lp(b"code") + m.code + _lp(b"model") + m.model + _lp(b"config") + m.config
    ).digest()
    assert m.combined == want
    assert m.to_hex() == {
        "code": m.code.hex(),
        "model": m.model.hex(),
        "config": m.config.hex(),
        "combined": want.hex(),
    }
    other = bytes(32)
    combos = {
        m.combined,
        Measurement(other, m.model, m.config).combined,
        Measurement(m.code, other, m.config).combined,
        Measurement(m.code, m.model, other).combined,
    }
    assert len(combos) == 4
    # components are labeled: the same digests in other slots combine differently
    assert combine(m.model, m.code, m.config) != m.combined
