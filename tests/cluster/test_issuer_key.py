"""The issuer's key file: a restarted issuer keeps the key the log holds (wallets use only the newest
logged key, so a fresh key at every restart stopped issuance until someone logged it)."""

import os

import pytest

from traceless_tools.cluster.issuer_key import IssuerKeyFileError, load_or_create_issuer


def test_a_restarted_issuer_keeps_its_key(tmp_path):
    path = tmp_path / "issuer-key.pem"
    first = load_or_create_issuer(path)
    assert (path.stat().st_mode & 0o777) == 0o600
    second = load_or_create_issuer(path)
    assert first.public_key.spki == second.public_key.spki
    assert "PRIVATE KEY" not in repr(second)


def test_a_key_file_others_can_read_or_that_holds_no_key_is_refused(tmp_path):
    path = tmp_path / "issuer-key.pem"
    load_or_create_issuer(path)
    os.chmod(path, 0o644)
    with pytest.raises(IssuerKeyFileError, match="0600"):
        load_or_create_issuer(path)
    path.write_bytes(b"not a key")
    os.chmod(path, 0o600)
    with pytest.raises(IssuerKeyFileError, match="RSA-2048"):
        load_or_create_issuer(path)


def test_the_issuer_command_takes_a_key_file(tmp_path):
    from traceless_tools.cli import build_parser

    args = build_parser().parse_args(["issuer", "--api-keys", "k.json", "--key-file", str(tmp_path / "k.pem")])
    assert args.key_file == str(tmp_path / "k.pem")
