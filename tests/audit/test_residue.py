import subprocess
import sys

import pytest

from traceless.audit.memscan import scan_process


def test_memscan_finds_a_string_a_process_holds():
    secret = b"MEMSCAN-PROBE-" + b"5a1c" * 4
    child = subprocess.Popen([sys.executable, "-c", f"import time; s = bytes.fromhex('{secret.hex()}') * 2; "
                                                    f"print('ready', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        counts = scan_process(child.pid, [secret, b"NEVER-THERE-" + b"0" * 16])
        assert counts[secret] >= 2 and counts[b"NEVER-THERE-" + b"0" * 16] == 0
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_residue_audit_finds_nothing_on_the_node_or_the_plaintext_server(tmp_path):
    from traceless.audit.residue import ResidueConfig, run

    rep = run(ResidueConfig(ttl_s=2.0), str(tmp_path / "r.json"))
    assert rep["failed"] is False and all(v == 0 for v in rep["places"].values())
    assert rep["process_memory_total"] == 0  # the node holds no canary
    serve = rep["serve"]  # and neither does the plaintext server, anywhere
    assert all(v == 0 for v in serve["places"].values()) and serve["process_memory_total"] == 0
    assert serve["preemptions"] >= 1
    assert rep["preemptions"] >= 1  # the preemption path (with KV sealed to disk) really ran
    assert rep["scrub"] is True and (tmp_path / "r.json").exists()
