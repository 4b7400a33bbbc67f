import subprocess
import sys

import pytest

from traceless_tools.audit.memscan import scan_process


def test_memscan_finds_a_string_a_process_holds():
    secret = b"MEMSCAN-PROBE-" + b"5a1c" * 4
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; s = bytes.fromhex('{secret.hex()}') * 2; print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout.readline().strip() == b"ready"
        counts = scan_process(child.pid, [secret, b"NEVER-THERE-" + b"0" * 16])
        assert counts[secret] >= 2 and counts[b"NEVER-THERE-" + b"0" * 16] == 0
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_residue_audit_finds_nothing_on_the_node_or_the_plaintext_server(tmp_path):
    from traceless_tools.audit.residue import ResidueConfig, run

    rep = run(ResidueConfig(ttl_s=2.0), str(tmp_path / "r.json"))
    assert rep["failed"] is False and all(v == 0 for v in rep["places"].values())
    assert rep["process_memory_total"] == 0  # the node holds no canary
    serve = rep["serve"]  # and neither does the plaintext server, anywhere
    assert all(v == 0 for v in serve["places"].values()) and serve["process_memory_total"] == 0
    assert serve["preemptions"] >= 1
    assert rep["preemptions"] >= 1  # the preemption path (with KV sealed to disk) really ran
    assert rep["scrub"] is True and (tmp_path / "r.json").exists()


def test_memscan_with_anchors_counts_like_without():
    from traceless_tools.audit.canary import anchors, new_canary, text_needles

    forms = text_needles(new_canary())
    needles = [n for ns in forms.values() for n in ns]
    held = b"".join(n + b"\x00" for n in needles) * 2  # every form, twice
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; s = bytes.fromhex('{held.hex()}'); print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout.readline().strip() == b"ready"
        fast = scan_process(child.pid, needles, anchors(forms))
        slow = scan_process(child.pid, needles)
    finally:
        child.kill()
        child.wait()
    assert fast == slow and all(v >= 2 for v in fast.values())


@pytest.mark.parametrize("one_pass", [False, True], ids=["find per anchor", "one pass"])
def test_memscan_finds_a_needle_across_a_chunk_boundary(one_pass):
    from traceless_tools.audit.memscan import _count_at_anchors, _count_in, _plan

    count = _count_at_anchors if one_pass else _count_in
    needle = b"xx-ANCHOR-yy"
    plan = _plan([needle], [b"ANCHOR"])
    counts = {needle: 0}
    data = b"." * 10 + needle  # the chunk is 12 bytes; the needle starts in it and runs past it
    count(data, 12, plan, counts)
    assert counts[needle] == 1
    counts = {needle: 0}
    count(data, 10, plan, counts)  # starts past this chunk: the next chunk counts it
    assert counts[needle] == 0
    with pytest.raises(ValueError):
        _plan([b"no anchor here"], [b"ANCHOR"])


def test_the_one_pass_scan_counts_like_a_find_per_anchor():
    """Anchors that start at the same place (one the other's prefix), anchors that overlap, and
    needles cut off at either end: the one-pass search counts each as the search per anchor does."""
    import random

    from traceless_tools.audit.memscan import _count_at_anchors, _count_in, _plan

    needles = [b"ab\0\0c", b"\0ab\0", b"ba\0", b"abab", b"xab\0\0\0"]
    plan = _plan(needles, [b"ab\0\0", b"ab", b"ba"])
    assert len(plan[b"ab\0\0"]) == 2 and (b"\0ab\0", 1) in plan[b"ab"] and (b"ba\0", 0) in plan[b"ba"]

    def both(data: bytes, size: int) -> dict[bytes, int]:
        one, each = dict.fromkeys(needles, 0), dict.fromkeys(needles, 0)
        _count_at_anchors(data, size, plan, one)
        _count_in(data, size, plan, each)
        assert one == each == {n: sum(data.startswith(n, i) for i in range(size)) for n in needles}, data
        return one

    assert both(b"x\0ab\0\0\0c", 9)[b"\0ab\0"] == 1  # "ab" starts where "ab\0\0" does
    assert both(b"ababa\0", 6) == {**dict.fromkeys(needles, 0), b"ba\0": 1, b"abab": 1}  # "ba" inside "ab"s
    rng = random.Random(0)
    for _ in range(2000):
        data = bytes(rng.choice(b"ab\0cx") for _ in range(rng.randrange(1, 40)))
        both(data, rng.randrange(1, len(data) + 1))


def test_canary_forms_cover_every_script_and_encoding():
    from traceless_tools.audit.canary import BYTE_LEVEL, byte_level, new_canary, text_needles, token_needles

    c = new_canary()
    latin, cyrillic, cjk = c.words
    assert (
        latin.isascii()
        and all("\u0400" <= ch <= "\u04ff" for ch in cyrillic)
        and all("\u4e00" <= ch <= "\u9fff" for ch in cjk)
    )
    forms = text_needles(c)
    assert ("\u0120" + latin).encode() in forms["word, byte-level BPE (Ġ)"]
    assert byte_level(" " + cyrillic).encode() in forms["word, byte-level BPE (Ġ)"]
    assert ("\u2581" + cjk).encode() in forms["word, SentencePiece (▁)"]
    assert (
        cyrillic.encode("utf-16-le") in forms["word (utf-16-le)"]
        and cjk.encode("utf-32-be") in forms["word (utf-32-be)"]
    )
    assert len(set(BYTE_LEVEL.values())) == 256 and BYTE_LEVEL[32] == "\u0120"
    ids = token_needles(c, lambda text: [ord(ch) for ch in text])
    assert (b"".join(ord(ch).to_bytes(8, "little") for ch in " " + latin)) in ids["token ids (int64)"]
    assert repr(c) == "Canary(...)"


def test_token_id_needles_skip_runs_too_plain_to_be_a_trace():
    """A tokenizer that spells a word as one id repeated (an unknown token, a byte vocabulary's
    zero) would make the needle match every zeroed page: such runs are not counted."""
    from traceless_tools.audit.canary import new_canary, token_needles

    c = new_canary()
    assert token_needles(c, lambda text: [0] * len(text)) == {"token ids (int32)": [], "token ids (int64)": []}
    assert all(token_needles(c, lambda text: [ord(ch) for ch in text]).values())


def test_the_audited_servers_cache_follows_the_engines_cache_dtype(monkeypatch, tiny_llama_dir):
    """The built-in GGUF model computes in float32 even on a bfloat16 CPU (its blocks are kept) and
    caches KV in float16; a dense checkpoint there computes and caches in bfloat16."""
    import traceless.runner.build as build
    from traceless_tools.audit.residue import _kv_budget

    blocks = 35  # 540 tokens in blocks of 16, and the null block
    monkeypatch.setattr(build, "cpu_runs_bf16", lambda: True)
    monkeypatch.setattr(build, "resolve_device", lambda name: build.torch.device("cpu"))
    assert _kv_budget(None) == str(blocks * 16 * 30 * 2 * 3 * 64 * 2)  # 30 layers, K and V, 3 kv heads of 64
    assert _kv_budget(str(tiny_llama_dir)) == str(blocks * 16 * 2 * 2 * 2 * 16 * 2)  # 2 layers, 2 kv heads of 16
    monkeypatch.setattr(build, "cpu_runs_bf16", lambda: False)
    assert _kv_budget(str(tiny_llama_dir)) == str(blocks * 16 * 2 * 2 * 2 * 16 * 4)


def test_the_audited_servers_cache_holds_the_same_tokens_with_kv_groups(tmp_path):
    """Gemma 3 keeps its local and global layers in separate KV groups: the budget still buys the
    engine the same number of blocks, so the preemption path runs out and spills as on Llama."""
    from tests.support.families import FAMILIES, make_family_model
    from traceless.config import EngineConfig
    from traceless.runner.build import build_engine_parts
    from traceless.runner.kv_budget import group_blocks
    from traceless_tools.audit.residue import KV_TOKENS, MAX_MODEL_LEN, _kv_budget

    kind, overrides = FAMILIES["gemma3"]
    path = make_family_model(tmp_path / "gemma3", kind, **overrides, max_position_embeddings=1024)
    budget = int(_kv_budget(str(path)))
    parts = build_engine_parts(EngineConfig(model=str(path), kv_cache_memory=budget, max_model_len=MAX_MODEL_LEN))
    windows = parts.model.kv_windows
    assert len(windows) > 1 and parts.model.kv_cache_bytes == budget  # whole blocks, every group's layers
    # one sequence of KV_TOKENS fits in every group, and eight of the preemption path's requests do not
    per_block = budget // (group_blocks(KV_TOKENS, 1, 16, windows, 2048) + 1)
    assert group_blocks(8 * 110, 8, 16, windows, 2048) * per_block > budget


def test_a_negative_load_is_refused():
    from traceless_tools.audit.residue import ResidueConfig

    with pytest.raises(ValueError, match="--load"):
        ResidueConfig(load=-1)
    out = subprocess.run(
        [sys.executable, "-m", "traceless_tools.cli", "audit", "residue", "--load", "-1"],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "--load must be 0 or more" in out.stderr
