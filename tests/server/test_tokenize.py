"""/tokenize and /detokenize in vLLM's shape, and /v1/models with max_model_len (plaintext server)."""

import httpx
import pytest


@pytest.fixture(scope="module")
def url(tiny_server):
    return tiny_server.url


@pytest.fixture(scope="module")
def model(url):
    return httpx.get(url + "/v1/models").json()["data"][0]["id"]


def test_models_carry_max_model_len(url):
    entry = httpx.get(url + "/v1/models").json()["data"][0]
    assert entry["max_model_len"] == 128 and entry["object"] == "model"


def test_tokenize_a_prompt_and_back(url, model):
    r = httpx.post(url + "/tokenize", json={"model": model, "prompt": "w5 w6 w300"})
    assert r.status_code == 200
    assert r.json() == {"count": 3, "max_model_len": 128, "tokens": [5, 6, 300], "token_strs": None}
    r = httpx.post(url + "/tokenize", json={"prompt": "w5 w6", "return_token_strs": True})  # model is optional
    assert r.json()["token_strs"] == ["w5", "w6"]
    assert httpx.post(url + "/detokenize", json={"model": model, "tokens": [5, 6, 300]}).json() == {
        "prompt": "w5 w6 w300"
    }


def test_tokenize_a_conversation_with_the_chat_template(url, model, tiny_server):
    messages = [{"role": "user", "content": "w7 w8"}]
    got = httpx.post(url + "/tokenize", json={"model": model, "messages": messages}).json()
    tok = tiny_server.engine.tokenizer
    want = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    assert got["tokens"] == want and got["count"] == len(want)
    no_prompt = httpx.post(url + "/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    assert no_prompt["tokens"] == want[: len(no_prompt["tokens"])] and no_prompt["count"] < len(want)


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {"prompt": "w5", "messages": [{"role": "user", "content": "w5"}]}, "prompt"),
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "w5", "add_generation_prompt": True}, "add_generation_prompt"),
        ("/tokenize", {"prompt": "w5", "secret_field": 1}, None),
        ("/detokenize", {"tokens": [5, 384]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": "w5"}, "tokens"),
        ("/detokenize", {}, "tokens"),
    ],
)
def test_bad_tokenizer_calls_are_400(url, path, body, param):
    r = httpx.post(url + path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert "secret_field" not in err["message"]


def test_unknown_model_is_404(url):
    assert httpx.post(url + "/tokenize", json={"model": "gpt-9", "prompt": "w5"}).status_code == 404
    assert httpx.post(url + "/detokenize", json={"model": "gpt-9", "tokens": [5]}).status_code == 404


def test_tokenizer_info_names_the_special_tokens_and_template(url, tiny_server):
    info = httpx.get(url + "/tokenizer_info").json()
    assert info["eos_token"] == "</s>" and info["model_max_length"] == 128
    assert info["chat_template"] == tiny_server.engine.tokenizer.chat_template
