"""/v1/completions with echo and logprobs (as OpenAI and lm-evaluation-harness use them), vLLM's
prompt_logprobs, and logit_bias, over HTTP, against transformers' float32 log-softmax."""

import json

import httpx
import pytest
import torch

from tests.support.logprobs import assert_argmax, assert_rank, assert_top


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model(tiny_server):
    return httpx.get(tiny_server.url + "/v1/models").json()["data"][0]["id"]


def post(server, body):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def reference(hf, ids):
    with torch.no_grad():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)  # [P, V]


PROMPT = [5, 17, 200, 33, 9, 140, 77, 301, 12, 64, 250, 8]


@pytest.mark.parametrize("prompt", [PROMPT, " ".join(f"w{t}" for t in PROMPT)], ids=["ids", "text"])
def test_echo_returns_the_prompt_and_its_logprobs(tiny_server, hf, model, prompt):
    body = post(
        tiny_server, {"model": model, "prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0}
    )
    choice = body["choices"][0]
    lp = choice["logprobs"]
    want = reference(hf, PROMPT)
    tok = [f"w{t}" for t in PROMPT]
    assert lp["tokens"][: len(PROMPT)] == tok and len(lp["tokens"]) == len(PROMPT) + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for k in range(1, len(PROMPT)):
        assert abs(lp["token_logprobs"][k] - float(want[k - 1, PROMPT[k]])) < 1e-4
        top = lp["top_logprobs"][k]
        assert_top([int(t[1:]) for t in top], list(top.values()), want[k - 1])
    # the generated token: greedy, its logprob the argmax of the last position (up to ties)
    assert abs(lp["token_logprobs"][-1] - float(want[-1].max())) < 1e-4
    assert_argmax(int(lp["tokens"][-1][1:]), want[-1])
    assert choice["text"].startswith(" ".join(tok))
    assert lp["text_offset"][0] == 0 and lp["text_offset"][-1] == len(" ".join(tok))
    assert body["usage"]["prompt_tokens"] == len(PROMPT)
    tiny_server.check_integrity()


def test_echo_without_logprobs_and_the_stream_agree(tiny_server, model):
    base = {"model": model, "prompt": "w5 w6 w7", "echo": True, "max_tokens": 4, "temperature": 0}
    whole = post(tiny_server, base)["choices"][0]
    assert whole["text"].startswith("w5 w6 w7") and whole["logprobs"] is None
    with_lp = post(tiny_server, {**base, "logprobs": 1})["choices"][0]
    assert with_lp["text"] == whole["text"]
    text, tokens, lps = "", [], []
    with httpx.stream(
        "POST", tiny_server.url + "/v1/completions", json={**base, "logprobs": 1, "stream": True}, timeout=60
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                c = json.loads(line[6:])["choices"][0]
                text += c["text"]
                if c["logprobs"]:
                    tokens += c["logprobs"]["tokens"]
                    lps += c["logprobs"]["token_logprobs"]
    assert text == whole["text"]
    assert tokens == with_lp["logprobs"]["tokens"] and lps == with_lp["logprobs"]["token_logprobs"]
    tiny_server.check_integrity()


def test_vllm_prompt_logprobs(tiny_server, hf, model):
    body = post(
        tiny_server, {"model": model, "prompt": PROMPT, "prompt_logprobs": 1, "max_tokens": 2, "temperature": 0, "n": 2}
    )
    want = reference(hf, PROMPT)
    for choice in body["choices"]:
        plp = choice["prompt_logprobs"]
        assert len(plp) == len(PROMPT) and plp[0] is None
        for k in range(1, len(PROMPT)):
            entry = plp[k]
            t = PROMPT[k]
            assert abs(entry[str(t)]["logprob"] - float(want[k - 1, t])) < 1e-4
            assert_rank(entry[str(t)]["rank"], want[k - 1], t)
            best = next(int(i) for i, e in entry.items() if e["rank"] == 1)
            assert_argmax(best, want[k - 1])
            assert entry[str(best)]["decoded_token"] == f"w{best}"
            assert len(entry) == (1 if best == t else 2)
    tiny_server.check_integrity()


def test_logit_bias_steers_greedy_output(tiny_server, model):
    base = {"model": model, "prompt": PROMPT, "max_tokens": 5, "temperature": 0}
    plain = post(tiny_server, base)["choices"][0]["text"].split()
    forced = post(tiny_server, {**base, "logit_bias": {"42": 100}})["choices"][0]["text"].split()
    assert forced == ["w42"] * 5 != plain
    banned = {str(int(w[1:])): -100 for w in plain}
    avoided = post(tiny_server, {**base, "logit_bias": banned})["choices"][0]["text"].split()
    assert not set(avoided) & set(plain)
    tiny_server.check_integrity()


def test_the_openai_client_reads_echo_logprobs_and_sends_logit_bias(tiny_server, model):
    from openai import OpenAI

    client = OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0)
    got = client.completions.create(
        model=model, prompt="w5 w6 w7", echo=True, logprobs=1, max_tokens=1, temperature=0, logit_bias={"9": 100}
    )
    lp = got.choices[0].logprobs
    assert lp.tokens == ["w5", "w6", "w7", "w9"] and lp.token_logprobs[0] is None
    assert got.choices[0].text.startswith("w5 w6 w7") and got.choices[0].text.endswith("w9")
    tiny_server.check_integrity()
