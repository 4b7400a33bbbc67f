"""The private request path end to end, every component a real process on loopback (what it checks:
openai client through the proxy, no plaintext at the relay or gateway, refusals, faults)."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
import uuid
from urllib.parse import urlparse

import httpx
import pytest

from tests.cluster.tap import Tap
from tests.support.private_path import client_config
from traceless import SamplingParams
from traceless.privacy.ohttp.call import encapsulate_call
from traceless.privacy.ohttp.keys import decode_ohttp_keys
from traceless.privacy.privacypass.http import format_authorization
from traceless_tools.client.private_client import AsyncPrivateClient, PrivateClient, PrivateClientError
from traceless_tools.local.services import free_port
from traceless_tools.local.up import Deployment, UpOptions

pytestmark = pytest.mark.slow


class TappedDeployment(Deployment):
    """traceless up, with a recording tap in front of the relay, the gateway and every node."""

    def __init__(self, opts):
        super().__init__(opts)
        self.taps: dict[str, Tap] = {}

    def link(self, target: str, url: str) -> str:
        tap = Tap(urlparse(url).port)
        self.taps[target] = tap
        return f"http://127.0.0.1:{tap.port}"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    d = TappedDeployment(
        UpOptions(
            [1, 2],
            free_port(),
            str(tmp_path_factory.mktemp("up")),
            ["--dtype", "float32", "--kv-cache-memory", "256MiB", "--max-model-len", "2048"],
        )
    )
    d.endpoints = d.start()
    try:
        yield d
    finally:
        d.stop()


def test_the_openai_client_through_the_proxy_matches_the_offline_api(deployment, real_llm):
    from openai import OpenAI

    e = deployment.endpoints
    client = OpenAI(base_url=e["proxy"] + "/v1", api_key="unused")
    q = "Name two planets of the solar system."
    want = (
        real_llm.chat([{"role": "user", "content": q}], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0]
        .outputs[0]
        .text
    )
    got = client.chat.completions.create(
        model=e["model"], messages=[{"role": "user", "content": q}], max_tokens=24, temperature=0
    )
    assert got.choices[0].message.content == want
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=e["model"], messages=[{"role": "user", "content": q}], max_tokens=24, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == want
    want_c = real_llm.generate("The sky is", SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    assert (
        client.completions.create(model=e["model"], prompt="The sky is", max_tokens=12, temperature=0).choices[0].text
        == want_c.outputs[0].text
    )


def test_models_tokenize_and_echo_logprobs_through_the_proxy(deployment, real_llm):
    e = deployment.endpoints
    proxy = e["proxy"]
    entry = httpx.get(proxy + "/v1/models", timeout=60).json()["data"][0]
    assert entry["id"] == e["model"] and entry["max_model_len"] == 2048  # the node's own answer
    tok = real_llm.get_tokenizer()
    text = "The sky is blue"
    got = httpx.post(proxy + "/tokenize", json={"model": e["model"], "prompt": text}, timeout=60).json()
    assert got["tokens"] == tok.encode(text) and got["max_model_len"] == 2048
    assert httpx.post(proxy + "/detokenize", json={"model": e["model"], "tokens": got["tokens"]}, timeout=60).json()[
        "prompt"
    ] == tok.decode(got["tokens"], skip_special_tokens=False)
    body = httpx.post(
        proxy + "/v1/completions",
        json={
            "model": e["model"],
            "prompt": got["tokens"],
            "echo": True,
            "logprobs": 1,
            "max_tokens": 1,
            "temperature": 0,
        },
        timeout=60,
    ).json()
    want = real_llm.generate(
        {"prompt_token_ids": got["tokens"]},
        SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1),
        use_tqdm=False,
    )[0]
    lps = body["choices"][0]["logprobs"]["token_logprobs"]
    assert lps[0] is None and len(lps) == len(got["tokens"]) + 1
    for k, t in enumerate(got["tokens"][1:], start=1):
        assert abs(lps[k] - want.prompt_logprobs[k][t].logprob) < 1e-4


def test_a_private_stream_ends_cleanly(deployment):
    """Iterate a PrivateClient stream to its very end (the SDK stops at [DONE]; this must not need to)."""
    e = deployment.endpoints
    client = PrivateClient(client_config(e, f"http://127.0.0.1:{deployment.taps['relay'].port}"))
    try:
        events = list(client.completions({"model": e["model"], "prompt": "Hello", "max_tokens": 5, "stream": True}))
    finally:
        client.close()
    assert events[-1].startswith(b"data: [DONE]") and len(events) >= 3


def test_relay_and_gateway_never_see_plaintext(deployment):
    from openai import OpenAI

    e = deployment.endpoints
    canary = f"CANARY-{uuid.uuid4().hex[:16]}"
    client = OpenAI(base_url=e["proxy"] + "/v1", api_key="unused")
    answer = (
        client.chat.completions.create(
            model=e["model"],
            messages=[{"role": "user", "content": f"Repeat exactly: {canary}"}],
            max_tokens=32,
            temperature=0,
        )
        .choices[0]
        .message.content
    )
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=e["model"],
            messages=[{"role": "user", "content": f"Say {canary} again"}],
            max_tokens=32,
            temperature=0,
            stream=True,
        )
        if c.choices
    )
    needles = [canary.encode(), canary[8:].encode()]
    needles += [t.strip().encode() for t in (answer, streamed) if len(t.strip()) >= 12]
    relay_and_gateway = ("relay", "gateway", "node0", "node1")  # every link into or out of them
    assert all(deployment.taps[name].captured for name in ("relay", "gateway"))  # the taps saw the traffic
    for name in relay_and_gateway:
        for needle in needles:
            assert deployment.taps[name].count(needle) == 0, (name, needle)


def _raw_request(e: dict, relay: str, node: dict, token_header: str | None, tamper: bool = False) -> httpx.Response:
    config = decode_ohttp_keys(base64.b64decode(node["ohttp_keys"]))[0]
    body = json.dumps({"model": e["model"], "prompt": "Hi", "max_tokens": 2}).encode()
    enc = encapsulate_call(config, b"/v1/completions", body, stream=False).body
    if tamper:
        enc = enc[:-3] + bytes([enc[-3] ^ 1]) + enc[-2:]
    headers = {"content-type": "message/ohttp-req"}
    if token_header:
        headers["authorization"] = token_header
    return httpx.post(f"{relay}/pcc/v1/ohttp/{node['node_id']}", content=enc, headers=headers, timeout=60)


def test_bad_requests_get_clear_4xx_and_nothing_is_processed(deployment):
    import asyncio

    e = deployment.endpoints
    relay = f"http://127.0.0.1:{deployment.taps['relay'].port}"
    node = httpx.get(relay + "/pcc/v1/nodes", params={"model": e["model"], "k": 1}).json()["nodes"][0]
    before = _processed(deployment)
    r = _raw_request(e, relay, node, None)
    assert r.status_code == 401 and "privatetoken" in r.headers.get("www-authenticate", "").lower()

    async def one_token():
        c = AsyncPrivateClient(client_config(e, relay, token_batch=2, token_low_water=1))
        try:
            return await c.wallet.take()
        finally:
            await c.aclose()

    token = format_authorization(asyncio.run(one_token()))
    tampered = _raw_request(e, relay, node, token, tamper=True)
    assert tampered.status_code == 400
    replayed = _raw_request(e, relay, node, token)
    assert replayed.status_code == 403 and replayed.json()["error"]["code"] == "token_replayed"
    unknown = _raw_request(e, relay, {**node, "node_id": "0" * 32}, token)
    assert unknown.status_code in (401, 403, 404)
    assert _processed(deployment) == before  # no engine ran any of them


def _processed(deployment) -> int:
    """OHTTP requests that a node answered with success, from the nodes' event logs (their metrics
    publish only windows of many requests). A tampered request reaches a node and fails there (4xx):
    it is not counted, nothing ran."""
    total = 0
    for i in range(len(deployment.endpoints["nodes"])):
        for line in (deployment.logs / f"node{i}.log").read_text().splitlines():
            if line.startswith("{") and '"event":"http.request"' in line and '"route":"ohttp"' in line:
                total += json.loads(line)["status_code"] < 400
    return total


@pytest.mark.parametrize(
    "change, reason",
    [
        ("attester", "untrusted_key"),
        ("log_key", "log_error"),
        ("log_went_back", "log_inconsistent"),
        ("not_in_log", "not_in_log"),
        ("unwitnessed", "log_unwitnessed"),
    ],
)
def test_the_client_refuses_unproven_nodes_before_sending_anything(deployment, tmp_path, change, reason, caplog):
    import logging

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    caplog.set_level(logging.INFO, logger="traceless.events")
    e = deployment.endpoints
    relay = f"http://127.0.0.1:{deployment.taps['relay'].port}"
    other_key = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    changes = {}
    if change == "attester":
        changes["attester_keys"] = (other_key,)
    elif change == "log_key":
        changes["log_public_key"] = other_key
    elif change == "unwitnessed":  # the log's head is cosigned, but not by a witness this client trusts
        changes["witness_keys"] = (other_key,)
    elif change == "not_in_log":
        changes.update(_other_log(tmp_path))
    posts_before = deployment.taps["relay"].count(b"POST /pcc/v1/ohttp/")
    tokens = _honest_tokens(e, relay, 2)
    client = PrivateClient(client_config(e, relay, **changes))
    # The candidate list costs a token, and a wallet checks the issuer's key in the same log its node
    # checks use: under a log it cannot verify, it would take none. Tokens an honest wallet took let
    # the round reach the node checks under test.
    client._client.wallet._tokens.extend(tokens)
    try:
        if change == "log_went_back":  # a tree head bigger than the log's: the log must have been rewritten
            from dataclasses import replace

            log = client._client.verifier._log
            log.last_sth = replace(log.get_sth(), tree_size=99)
        with pytest.raises(PrivateClientError, match="nothing was sent"):
            client.chat({"model": e["model"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    finally:
        client.close()
    assert deployment.taps["relay"].count(b"POST /pcc/v1/ohttp/") == posts_before
    assert any(f'"reason":"{reason}"' in r.getMessage() for r in caplog.records)


def _honest_tokens(e: dict, relay: str, count: int) -> list:
    honest = PrivateClient(client_config(e, relay))
    try:
        return [honest._run(honest._client.wallet.take()) for _ in range(count)]
    finally:
        honest.close()


def _other_log(tmp_path) -> dict:
    """A second, honest and witnessed transparency log that does not contain the nodes' release."""
    import threading

    import uvicorn

    from traceless.privacy.translog.log import TransparencyLog
    from traceless.privacy.translog.witness import Witness
    from traceless_tools.cluster.log_service import create_app
    from traceless_tools.cluster.witness_service import run
    from traceless_tools.local.services import free_port

    log = TransparencyLog.create(tmp_path / "log")
    log.append(b"\x42" * 32)
    witness = Witness(tmp_path / "witness", log.public_key_bytes())
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(log, (witness.public_key,)), host="127.0.0.1", port=port, log_config=None)
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    run(witness, f"http://127.0.0.1:{port}", 1.0, rounds=1)
    return {
        "log_url": f"http://127.0.0.1:{port}",
        "log_public_key": log.public_key_bytes(),
        "witness_keys": (witness.public_key,),
    }


def test_zz_killing_a_node_mid_stream_fails_cleanly_and_the_rest_keeps_serving(deployment):
    e = deployment.endpoints
    relay = f"http://127.0.0.1:{deployment.taps['relay'].port}"
    client = PrivateClient(client_config(e, relay))
    try:
        before = {n: deployment.taps[n].count(b"POST /pcc/v1/ohttp") for n in ("node0", "node1")}
        stream = client.completions(
            {"model": e["model"], "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}
        )
        next(stream)
        serving = next(n for n in before if deployment.taps[n].count(b"POST /pcc/v1/ohttp") > before[n])
        proc = dict(deployment.procs)[serving]
        os.killpg(proc.pid, signal.SIGKILL)
        with pytest.raises(PrivateClientError):
            for _ in stream:
                pass
        # The failure is surfaced, not resent; the next request starts from a fresh round of nonce-bound
        # attestations, which the dead node cannot answer, so the surviving node serves it and the rest.
        for _ in range(3):
            out = client.completions({"model": e["model"], "prompt": "Hello", "max_tokens": 3})
            assert out["choices"][0]["text"]
    finally:
        client.close()
    canary_dirs = [deployment.state]
    for d in canary_dirs:  # no request data on disk: only logs, keys and the release log
        for path in d.rglob("*"):
            if path.is_file():
                assert b"Once upon a time" not in path.read_bytes(), path
