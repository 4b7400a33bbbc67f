"""The copied vectors are byte for byte what their provenance file lists."""

import hashlib

from tests.vectors import VECTORS


def test_every_vector_file_matches_its_recorded_digest():
    lines = (VECTORS / "SHA256SUMS.txt").read_text().splitlines()
    assert len(lines) > 200
    for line in lines:
        digest, name = line.split(maxsplit=1)
        assert hashlib.sha256((VECTORS / name).read_bytes()).hexdigest() == digest, name


def test_no_file_is_left_out_of_the_digest_list():
    listed = {
        line.split(maxsplit=1)[1].removeprefix("./") for line in (VECTORS / "SHA256SUMS.txt").read_text().splitlines()
    }
    present = {p.relative_to(VECTORS).as_posix() for p in VECTORS.rglob("*") if p.is_file()}
    assert present - listed == {"SHA256SUMS.txt"}
