"""`traceless node --log`: a node refuses to start unless its release is logged and allows its capacity
(threat T14, docs/threat-model.md: a node started with a capacity no logged release allows is
refused with a clear error)."""

import base64
from contextlib import ExitStack

import pytest

from tests.support.cluster_services import RELEASE
from tests.support.log_service import running_log_service
from traceless.cli.node import check_release_allows
from traceless.privacy.translog.log import TransparencyLog


def test_the_node_fails_fast_on_a_capacity_its_release_does_not_allow(tmp_path):
    log = TransparencyLog.create(tmp_path / "log")
    log.append(RELEASE.encode())
    key = base64.b64encode(log.public_key_bytes()).decode()
    with ExitStack() as stack:
        url = stack.enter_context(running_log_service(tmp_path / "log"))
        check_release_allows(url, key, RELEASE.combined, 3)  # allowed: no exit
        with pytest.raises(SystemExit, match=r"--capacity 9 is not allowed by the logged release \(it allows: 1, 2"):
            check_release_allows(url, key, RELEASE.combined, 9)
        with pytest.raises(SystemExit, match="not a release in the transparency log"):
            check_release_allows(url, key, b"\x07" * 32, 1)
