"""Bad input gets its OpenAI-shaped error with the right status, and the server keeps serving."""

import json

import httpx
import pytest

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def url(tiny_server):
    return tiny_server.url


def post(url, path, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(url + path, content=data, headers={"content-type": "application/json"}, timeout=60, **kw)


def ok_completion(url, model):
    r = post(url, "/v1/completions", {"model": model, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


@pytest.fixture(scope="module")
def model(url):
    return httpx.get(url + "/v1/models").json()["data"][0]["id"]


CASES = [
    ("malformed json", "/v1/completions", b"{not json", 400, "invalid_json", None),
    ("not an object", "/v1/completions", b"[1, 2]", 400, None, None),
    ("unknown field", "/v1/completions", {"prompt": "w5", "best_friend": 1}, 400, "unsupported_parameter", None),
    ("wrong type", "/v1/completions", {"prompt": "w5", "max_tokens": "ten"}, 400, None, "max_tokens"),
    ("negative max_tokens", "/v1/completions", {"prompt": "w5", "max_tokens": -3}, 400, None, "max_tokens"),
    ("huge max_tokens", "/v1/completions", {"prompt": "w5", "max_tokens": 10**9}, 400, "context_length_exceeded", None),
    ("negative temperature", "/v1/completions", {"prompt": "w5", "temperature": -1}, 400, None, "temperature"),
    ("prompt too long", "/v1/completions", {"prompt": [5] * 500}, 400, "context_length_exceeded", None),
    ("token out of vocab", "/v1/completions", {"prompt": [5, 10**7]}, 400, None, None),
    ("empty prompt", "/v1/completions", {"prompt": ""}, 400, None, None),
    ("missing prompt", "/v1/completions", {}, 400, "missing_required_parameter", "prompt"),
    (
        "logit_bias token out of vocab",
        "/v1/completions",
        {"prompt": "w5", "logit_bias": {"5": 1, "384": 10}},
        400,
        None,
        None,
    ),
    (
        "logit_bias key not a token id",
        "/v1/completions",
        {"prompt": "w5", "logit_bias": {"w5": 10}},
        400,
        None,
        "logit_bias",
    ),
    (
        "logit_bias out of range",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "w5"}], "logit_bias": {"5": 100.5}},
        400,
        None,
        "logit_bias",
    ),
    ("echo not a boolean", "/v1/completions", {"prompt": "w5", "echo": "yes"}, 400, None, "echo"),
    (
        "prompt_logprobs too many",
        "/v1/completions",
        {"prompt": "w5", "prompt_logprobs": 6},
        400,
        None,
        "prompt_logprobs",
    ),
    (
        "prompt_logprobs on chat",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "w5"}], "prompt_logprobs": 1},
        400,
        "unsupported_parameter",
        None,
    ),
    (
        "malformed tool",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "w5"}], "tools": [{"type": "function"}]},
        400,
        None,
        "tools[0]",
    ),
    (
        "response_format",
        "/v1/completions",
        {"prompt": "w5", "response_format": {"type": "xml"}},
        400,
        "unsupported_parameter",
        "response_format",
    ),
    ("bad role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "w5"}]}, 400, None, "messages[0]"),
    ("bad content", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, None, "messages[0]"),
    (
        "top_logprobs alone",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "w5"}], "top_logprobs": 2},
        400,
        None,
        "top_logprobs",
    ),
    ("weak cache_salt", "/v1/completions", {"prompt": "w5", "cache_salt": "only-16-chars-ok"}, 400, None, "cache_salt"),
    ("cache_salt not a string", "/v1/completions", {"prompt": "w5", "cache_salt": 12345}, 400, None, "cache_salt"),
    (
        "stream_options without stream",
        "/v1/completions",
        {"prompt": "w5", "stream_options": {"include_usage": True}},
        400,
        None,
        "stream_options",
    ),
]


@pytest.mark.parametrize("name, path, body, status, code, param", CASES, ids=[c[0] for c in CASES])
def test_bad_requests_get_openai_errors(url, model, name, path, body, status, code, param):
    if isinstance(body, dict):
        body = {"model": model, **body}
    r = post(url, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code:
        assert err["code"] == code
    if param:
        assert err["param"] == param
    ok_completion(url, model)


def test_a_good_cache_salt_is_accepted(url, model):
    r = post(
        url,
        "/v1/completions",
        {"model": model, "prompt": [5, 6, 7], "max_tokens": 2, "cache_salt": "Zm9vYmFyYmF6cXV4cXV1eHp6enp6"},
    )
    assert r.status_code == 200, r.text


def test_unknown_model_is_404(url, model):
    r = post(url, "/v1/completions", {"model": "gpt-9", "prompt": "w5"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_oversized_body_is_413(url, model):
    big = json.dumps({"model": model, "prompt": "w5 " * 40000})
    r = post(url, "/v1/completions", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    ok_completion(url, model)


def test_unknown_route_and_method(url):
    assert httpx.get(url + "/v1/nothing").status_code == 404
    r = httpx.get(url + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_client_disconnect_mid_stream_aborts_and_frees(tiny_server, model):
    body = {
        "model": model,
        "prompt": [5, 6, 7],
        "max_tokens": 100,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", tiny_server.url + "/v1/completions", json=body) as r:
            it = r.iter_lines()
            first = [next(it) for _ in range(3)]
            assert any(line.startswith("data: ") for line in first)
    # the connection is closed: the request must be aborted, its blocks freed and zeroed
    tiny_server.check_integrity()
    ok_completion(tiny_server.url, model)


def test_client_disconnect_during_non_streaming_request_aborts(tiny_server, model):
    body = {"model": model, "prompt": [5, 6, 7], "max_tokens": 120, "temperature": 0, "ignore_eos": True}
    with tiny_server.slowed(0.02):  # 120 steps take > 2 s; the client gives up after 0.3 s
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(tiny_server.url + "/v1/completions", json=body, timeout=0.3)
        tiny_server.wait_idle(timeout=1.5)  # aborted: nowhere near the 2.4 s a finished request takes
    tiny_server.check_integrity()
    ok_completion(tiny_server.url, model)


def test_queue_full_is_503_with_retry_after(tiny_llama_dir):
    from tests.support.serving import make_served_app, serve
    from traceless.config import EngineConfig

    app, engine = make_served_app(
        EngineConfig(
            model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128, max_queued_requests=1
        )
    )
    with serve(app, engine) as s, s.slowed(0.05):  # the first request surely holds its slot
        m = httpx.get(s.url + "/v1/models").json()["data"][0]["id"]
        body = {"model": m, "prompt": [5, 6], "max_tokens": 100, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=60) as client, client.stream("POST", s.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()  # keep the iterator: dropping it closes the stream (a disconnect)
            next(lines)  # the first request holds the only slot
            second = client.post(s.url + "/v1/completions", json={**body, "stream": False})
            assert second.status_code == 503 and "retry-after" in second.headers
            assert second.json()["error"]["code"] == "queue_full"
        s.check_integrity()


SECRET_KEY = "my-diagnosis-is-TRACELESS-KEY-7c1e"


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "w5", SECRET_KEY: 1}),
        ("/v1/completions", {"prompt": "w5", SECRET_KEY: 1, "another " + SECRET_KEY: 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5", SECRET_KEY: "x"}]}),
    ],
    ids=["top-level", "two-unknown", "in-a-message"],
)
def test_errors_never_name_a_client_chosen_key(url, model, path, body):
    """A key name is client-chosen text (content): errors say how many fields are unknown, never which."""
    r = post(url, path, {"model": model, **body})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter"
    assert SECRET_KEY not in r.text and "TRACELESS-KEY" not in r.text
    unknown = sum(SECRET_KEY in k for k in body) + sum(SECRET_KEY in k for m in body.get("messages", []) for k in m)
    assert f"{unknown} unknown field" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "path, body, named",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "metadata": {"a": "b"}}, "metadata"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "store": True}, "store"),
        ("/v1/completions", {"prompt": "w5", "min_tokens": 3}, "min_tokens"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "w5"}], "chat_template_kwargs": {"enable_thinking": False}},
            "chat_template_kwargs",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "guided_json": {}}, "guided_json"),
    ],
    ids=["metadata", "store", "min_tokens", "chat_template_kwargs", "guided_json"],
)
def test_a_known_openai_or_vllm_field_is_named(url, model, path, body, named):
    """Fields of OpenAI's or vLLM's API come from a fixed list in the server: naming them echoes
    nothing a client chose. The error points at the reference of supported fields."""
    r = post(url, path, {"model": model, **body})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "unsupported_parameter" and error["param"] == named
    assert f"'{named}'" in error["message"] and "not supported" in error["message"]
    assert "docs/api.md" in error["message"]


def test_known_fields_are_named_and_unknown_ones_only_counted(url, model):
    r = post(url, "/v1/completions", {"model": model, "prompt": "w5", "store": False, SECRET_KEY: 1})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "'store'" in message and "1 other unknown field" in message
    assert SECRET_KEY not in r.text


def test_every_field_named_in_errors_comes_from_the_fixed_list():
    from traceless.server.known_fields import KNOWN_UNSUPPORTED
    from traceless.server.protocol import CHAT_FIELDS, COMPLETION_FIELDS

    assert not set(KNOWN_UNSUPPORTED) & (set(CHAT_FIELDS) | set(COMPLETION_FIELDS))  # supported ones are not "known"
    assert {"metadata", "store", "min_tokens", "chat_template_kwargs"} <= set(KNOWN_UNSUPPORTED)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "w5", "n": 9}, "n"),
        ({"prompt": ["w5"] * 9}, "prompt"),
        ({"prompt": [[5, 6]] * 9}, "prompt"),
        ({"prompt": ["w5"] * 3, "n": 3}, "n"),  # 9 choices in all
    ],
)
def test_one_request_buys_at_most_max_choices_engine_requests(url, model, body, param):
    from traceless.server.protocol import MAX_CHOICES

    assert MAX_CHOICES == 8
    r = post(url, "/v1/completions", {"model": model, "max_tokens": 1, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert r.json()["error"]["code"] == "too_many_choices"
    ok = post(url, "/v1/completions", {"model": model, "prompt": ["w5", "w6"], "n": 4, "max_tokens": 1})
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 8


def test_tokenization_runs_off_the_event_loop(tiny_server, model, monkeypatch):
    """While one request's prompt is being tokenized (held here until the test lets it go), the
    server answers other requests: preparation does not run on the event loop."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    tok = tiny_server.engine.tokenizer
    real, entered, gate = tok.encode, threading.Event(), threading.Event()

    def held_encode(text, *args, **kwargs):
        if "w7 w7 w7" in text:
            entered.set()
            gate.wait(60)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(tok, "encode", held_encode)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            post, tiny_server.url, "/v1/completions", {"model": model, "prompt": "w7 w7 w7", "max_tokens": 2}
        )
        try:
            assert entered.wait(30)
            other = httpx.get(tiny_server.url + "/v1/models", timeout=15)
        finally:
            gate.set()
        assert other.status_code == 200
        assert held.result(60).status_code == 200
