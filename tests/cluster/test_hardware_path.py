"""Threat T25 (docs/threat-model.md): the private path end to end with hardware attestation. A node on a tiny
model whose attester is hardware-backed (SEV-SNP through a fake configfs-tsm, one GPU through a
fake NVML, both signing with test keys as the hardware would) registers with a gateway and answers
the openai client through relay and proxy, under a policy file that pins the test roots; the proxy's
/status names the kind. The software attester is refused under that (production-shaped) policy, by
the gateway and by the client on its own, and evidence made for another key is refused."""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.privacy.attestation.fake_hardware import hardware_attester, write_policy_file
from tests.privacy.attestation.forge import make_amd_chain
from tests.privacy.attestation.forge_nvidia import GpuTestChain
from tests.support.cluster_services import RELEASE, StubReleases, mint_tokens, running_app
from traceless import SamplingParams
from traceless.config import EngineConfig
from traceless.entrypoints.build import build_engine
from traceless.entrypoints.llm import LLM
from traceless.node.app import create_node_app
from traceless.node.identity import NodeIdentity
from traceless.node.keyring import KeyRing
from traceless.node.registration import registration_body
from traceless.node.settings import NodeSettings
from traceless.privacy.attestation.collectors import Collector, Evidence
from traceless.privacy.attestation.evidence_policy import AttestationPolicy
from traceless.privacy.attestation.hardware import HardwareAttester, evidence_to_json
from traceless.privacy.attestation.policy_file import load_policy_file
from traceless.privacy.attestation.software import AttestationClaims, Attester, SoftwareAttester, b64url_decode
from traceless.privacy.privacypass.batch_issuance import ApiKeyStore
from traceless.privacy.privacypass.protocol import Issuer
from traceless.privacy.translog.log import TransparencyLog
from traceless.server.async_engine import AsyncEngine
from traceless_tools.client.node_verifier import NodeRefused, NodeVerifier
from traceless_tools.client.private_client import AsyncPrivateClient, ClientConfig, PrivateClient, PrivateClientError
from traceless_tools.client.proxy import create_proxy_app
from traceless_tools.cluster.gateway import GatewayConfig, create_gateway_app
from traceless_tools.cluster.issuer import IssuerConfig, create_issuer_app
from traceless_tools.cluster.log_service import create_app as create_log_app
from traceless_tools.cluster.relay import RelayConfig, create_relay_app

MODEL = "tiny"
API_KEY = "k" * 32


@pytest.fixture(scope="module")
def amd():
    return make_amd_chain()


@pytest.fixture(scope="module")
def gpu():
    return GpuTestChain()


@pytest.fixture(scope="module")
def policy_file(amd, gpu, tmp_path_factory) -> Path:
    return write_policy_file(tmp_path_factory.mktemp("policy"), amd, gpu)


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """The parts of the path that do not depend on the node or the gateway's policy: the issuer, and
    the log (holding the node's release and the issuer's key) with a witness that has cosigned it."""
    from traceless.privacy.translog.manifest import IssuerKeyEntry
    from traceless.privacy.translog.witness import Witness
    from traceless_tools.cluster.issuer_directory import fetch_issuer_keys, issuer_name
    from traceless_tools.cluster.witness_service import run as run_witness

    issuer = Issuer.generate()
    tmp = tmp_path_factory.mktemp("log")
    log = TransparencyLog.create(tmp / "log")
    log.append(RELEASE.encode())  # the release the test node runs (its measurement and capacities)
    issuer_app = create_issuer_app(IssuerConfig(), ApiKeyStore({"user": API_KEY}), issuer=issuer)
    with running_app(issuer_app) as issuer_url:
        now = int(time.time())
        for key in fetch_issuer_keys(issuer_url):  # wallets take only logged issuer keys
            log.append(IssuerKeyEntry(issuer_name(issuer_url), key.spki, now - 60, now + 3600).encode())
        witness = Witness(tmp / "witness", log.public_key_bytes())
        with running_app(create_log_app(log, (witness.public_key,))) as log_url:
            run_witness(witness, log_url, 1.0, rounds=1)
            yield {
                "issuer": issuer,
                "issuer_url": issuer_url,
                "log_url": log_url,
                "log_key": log.public_key_bytes(),
                "witness_keys": (witness.public_key,),
            }


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return lambda: AsyncEngine(
        build_engine(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128))
    )


@contextmanager
def private_path(
    services,
    engine,
    attester: Attester,
    gateway_policy: AttestationPolicy | None,
    clock: Callable[[], float] = time.time,
):
    """node -> gateway (with `gateway_policy`) -> relay; yields (node identity, gateway URL, relay URL,
    the node's registration response). The node registers once, by its own registration code."""
    with ExitStack() as stack:
        identity = NodeIdentity(attester, RELEASE.measurement, capacity=1, clock=clock)
        settings = NodeSettings(MODEL)
        node_url = stack.enter_context(running_app(create_node_app(engine(), identity, settings)))
        identity.node_url = node_url
        gateway = create_gateway_app(
            GatewayConfig(issuer_url=services["issuer_url"], health_interval_s=3600, evidence_policy=gateway_policy),
            [services["issuer"].public_key],
            releases=StubReleases(RELEASE),
        )
        gateway_url = stack.enter_context(running_app(gateway))
        registered = httpx.post(
            gateway_url + "/pcc/v1/register", json=registration_body(identity, settings), timeout=30
        )
        relay_url = stack.enter_context(running_app(create_relay_app(RelayConfig(gateway_url=gateway_url))))
        yield identity, gateway_url, relay_url, registered


def client_config(
    services, gateway_url: str, relay_url: str, policy: AttestationPolicy, attester_keys=()
) -> ClientConfig:
    return ClientConfig(
        issuer_url=services["issuer_url"],
        api_key=API_KEY,
        relay_url=relay_url,
        witness_keys=services["witness_keys"],
        max_tree_head_age_s=3600,
        log_url=services["log_url"],
        log_public_key=services["log_key"],
        attester_keys=tuple(attester_keys),
        model=MODEL,
        evidence_policy=policy,
    )


def test_a_hardware_node_answers_the_openai_client_under_the_test_policy(
    services, engine, policy_file, amd, gpu, tmp_path, tiny_llama_dir
):
    from openai import OpenAI

    policy = load_policy_file(policy_file)
    attester = hardware_attester(tmp_path / "tsm" / "report", amd, gpu)
    with private_path(services, engine, attester, policy) as (identity, gateway_url, relay_url, registered):
        assert registered.status_code == 200, registered.text
        challenge = httpx.get(relay_url + "/pcc/v1/challenge").headers["www-authenticate"]
        (token,) = mint_tokens(services["issuer"], challenge, 1)
        listed = httpx.get(
            relay_url + "/pcc/v1/nodes", params={"model": MODEL, "nonce": "ab" * 16}, headers={"authorization": token}
        ).json()["nodes"]
        assert [item["kind"] for item in listed[0]["evidence"]] == ["snp", "nvidia"]
        assert listed[0]["base_attestation"] != listed[0]["attestation"]
        client = AsyncPrivateClient(client_config(services, gateway_url, relay_url, policy))
        try:
            with running_app(create_proxy_app(client)) as proxy_url:
                assert httpx.get(proxy_url + "/status").json()["nodes"] == []  # nothing verified yet
                openai = OpenAI(base_url=proxy_url + "/v1", api_key="unused")
                got = openai.completions.create(model=MODEL, prompt="Hello there", max_tokens=6, temperature=0)
                status = httpx.get(proxy_url + "/status").json()
        finally:
            client.verifier.close()
    want = (
        LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20)
        .generate(["Hello there"], SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]
        .outputs[0]
        .text
    )
    assert got.choices[0].text == want
    assert status["policy"] == "test" and status["attestation_kinds"] == ["snp+nvidia"]
    (node,) = status["nodes"]
    assert node["attestation_kind"] == "snp+nvidia" and node["measurement"] == RELEASE.measurement.combined.hex()
    assert status["refused"] == {}
    assert list((tmp_path / "tsm" / "report").iterdir()) == []  # every report entry was removed after use


def test_the_software_attester_is_refused_under_the_production_policy(services, engine, policy_file, caplog):
    caplog.set_level(logging.INFO, logger="traceless.events")
    policy = load_policy_file(policy_file)
    software = SoftwareAttester()
    # The gateway under the hardware policy refuses the registration, naming the rule.
    with private_path(services, engine, software, policy) as (_, _, _, registered):
        assert registered.status_code == 403
        error = registered.json()["error"]
        assert error["code"] == "evidence_refused" and "software_attester_refused" in error["message"]
    # A gateway that admits it (the development policy) cannot make the client accept it: the client
    # refuses it under its own policy, before sending anything, even with the node's key pinned.
    dev_policy = AttestationPolicy.development()
    with private_path(services, engine, software, dev_policy) as (_, gateway_url, relay_url, registered):
        assert registered.status_code == 200, registered.text
        key = software.public_key.public_bytes_raw()
        client = PrivateClient(client_config(services, gateway_url, relay_url, policy, attester_keys=(key,)))
        try:
            with pytest.raises(PrivateClientError, match="nothing was sent"):
                client.completions({"model": MODEL, "prompt": "hi", "max_tokens": 2})
            assert client._client.status()["refused"] == {"evidence_refused": 1}
        finally:
            client.close()
        # The same node passes a client whose policy is explicitly the development one.
        dev = PrivateClient(
            client_config(services, gateway_url, relay_url, AttestationPolicy.development(), attester_keys=(key,))
        )
        try:
            assert dev.completions({"model": MODEL, "prompt": "hi", "max_tokens": 2})["choices"][0]["text"]
            assert dev._client.status()["attestation_kinds"] == ["software"]
        finally:
            dev.close()
    messages = [r.getMessage() for r in caplog.records]
    assert any('"client.evidence_refused"' in m and '"reason":"software_attester_refused"' in m for m in messages)
    assert any('"client.attestation_kind"' in m and '"kind":"software"' in m for m in messages)


class ReplayingAttester(HardwareAttester):
    """Signs its own documents but offers the evidence another node's hardware made for the same
    claims under that node's key (all it can get: it cannot make the hardware bind its own key)."""

    def __init__(self, victim: HardwareAttester) -> None:
        super().__init__(cpu=None, gpus=(Unreachable(),))
        self.victim = victim

    def evidence(self, document: str):
        return self.victim.evidence(self.victim.attest(_claims(document)))


class Unreachable(Collector):
    def collect(self, report_data: bytes) -> Evidence:
        raise AssertionError("the replaying attester has no hardware of its own")


def _claims(document: str) -> AttestationClaims:
    return AttestationClaims.from_json(json.loads(b64url_decode(document.split(".")[1])))


def test_evidence_for_another_key_is_refused(services, engine, policy_file, amd, gpu, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="traceless.events")
    policy = load_policy_file(policy_file)
    honest = hardware_attester(tmp_path / "tsm" / "report", amd, gpu)
    thief = ReplayingAttester(honest)
    with private_path(services, engine, thief, policy) as (identity, gateway_url, _, registered):
        assert registered.status_code == 403
        assert registered.json()["error"]["code"] == "evidence_refused"
        assert "snp:report-data" in registered.json()["error"]["message"]
        assert httpx.get(gateway_url + "/pcc/v1/nodes", params={"model": MODEL}).status_code == 404
        # The client refuses it on its own too (a gateway that listed it anyway would change nothing).
        nonce = b"c" * 16
        document, keys = identity.attestation(nonce, 300)
        entry = {
            "node_id": "n",
            "attestation": document,
            "ohttp_keys": base64.b64encode(keys).decode(),
            "evidence": identity.evidence(document),
        }
        verifier = NodeVerifier(
            client_config(services, "http://gateway.invalid", "http://relay.invalid", policy),
            releases=StubReleases(RELEASE),
        )
        try:
            with pytest.raises(NodeRefused) as refused:
                verifier.verify(entry, expected_nonce=nonce)
            assert refused.value.reason == "evidence_refused"
            # The honest node's document with that same evidence passes: what failed is the key.
            honest_doc = honest.attest(_claims(document))
            honest_entry = {
                **entry,
                "attestation": honest_doc,
                "evidence": [evidence_to_json(e) for e in honest.evidence(honest_doc)],
            }
            assert verifier.verify(honest_entry, expected_nonce=nonce).attestation_kind == "snp+nvidia"
        finally:
            verifier.close()
    assert any(
        '"client.evidence_refused"' in m and '"check":"report-data"' in m
        for m in (r.getMessage() for r in caplog.records)
    )


def test_a_node_whose_hardware_fails_answers_503_and_offers_no_document(
    services, engine, policy_file, amd, gpu, tmp_path
):
    attester = hardware_attester(tmp_path / "tsm" / "report", amd, gpu)
    later = [0.0]  # the node's clock runs this far ahead of the wall clock
    with private_path(
        services, engine, attester, load_policy_file(policy_file), clock=lambda: time.time() + later[0]
    ) as (identity, _, _, registered):
        assert registered.status_code == 200
        (tmp_path / "tsm" / "report").rmdir()  # the configfs-tsm interface went away
        url, params = identity.node_url + "/pcc/v1/attestation", {"nonce": "ab" * 16}
        # Its keys have not changed: the evidence collected at registration still vouches for its key.
        r = httpx.get(url, params=params)
        assert r.status_code == 200 and r.json()["evidence"]
        identity.keys = KeyRing()  # a new key set, the old one gone: evidence must be collected again
        later[0] = identity.evidence_cache.limits.min_interval_s  # past the collection cap
        r = httpx.get(url, params=params)
        assert r.status_code == 503 and r.json()["error"]["code"] == "evidence_unavailable"
        assert "attestation" not in r.json()
        # Asked again before its collection interval has passed, it does not try again: nothing it holds
        # vouches for its live keys, so it refuses, saying when to come back.
        r = httpx.get(url, params=params)
        assert r.status_code == 503 and r.json()["error"]["code"] == "evidence_rate_limited"
        assert 0 < int(r.headers["retry-after"]) <= 60 and "attestation" not in r.json()
        assert identity.evidence_cache.collections == 2
