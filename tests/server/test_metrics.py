import httpx
import pytest

from traceless.server.metrics import Metrics, UnknownMetric


def test_only_allowlisted_names_labels_and_values():
    m = Metrics()
    m.inc("traceless_requests_total", endpoint="completions", status="ok")
    with pytest.raises(UnknownMetric):
        m.inc("traceless_prompts_seen_total")  # not declared
    with pytest.raises(UnknownMetric):
        m.inc("traceless_requests_total", endpoint="completions", status="ok", user="alice")  # undeclared label
    with pytest.raises(UnknownMetric):
        m.inc("traceless_requests_total", endpoint="completions", status="what the user typed")  # undeclared value
    with pytest.raises(UnknownMetric):
        m.observe("traceless_requests_total", 1.0)  # wrong kind


def test_prometheus_text_format():
    m = Metrics()
    m.inc("traceless_requests_total", endpoint="chat_completions", status="ok")
    m.inc("traceless_requests_total", endpoint="chat_completions", status="ok")
    m.observe("traceless_time_to_first_token_seconds", 0.03)
    m.observe("traceless_time_to_first_token_seconds", 7.0)
    m.set("traceless_kv_cache_usage_ratio", 0.25)
    text = m.render()
    assert 'traceless_requests_total{endpoint="chat_completions",status="ok"} 2' in text
    assert 'traceless_time_to_first_token_seconds_bucket{le="0.05"} 1' in text
    assert 'traceless_time_to_first_token_seconds_bucket{le="+Inf"} 2' in text
    assert "traceless_time_to_first_token_seconds_count 2" in text
    assert "traceless_kv_cache_usage_ratio 0.25" in text
    assert "# TYPE traceless_inter_token_latency_seconds histogram" in text


def test_live_metrics_count_requests_and_tokens(tiny_server):
    url = tiny_server.url
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    before = httpx.get(url + "/metrics").text
    r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": [5, 6, 7], "max_tokens": 4,
                                                   "ignore_eos": True, "stream": True}, timeout=60)
    assert r.status_code == 200
    after = httpx.get(url + "/metrics").text

    def value(text, prefix):
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))

    assert value(after, "traceless_generation_tokens_total") - value(before, "traceless_generation_tokens_total") == 4
    assert value(after, "traceless_prompt_tokens_total") - value(before, "traceless_prompt_tokens_total") == 3
    itl = "traceless_inter_token_latency_seconds_count"
    assert value(after, itl) - value(before, itl) == 3
    for line in after.splitlines():  # nothing outside the declared families
        assert line.startswith("# ") or line.split("{")[0].split(" ")[0].startswith("traceless_")


def test_speculative_decoding_counters_are_exported(tiny_llama_dir):
    from tests.server.serving import make_served_app, serve
    from traceless.config import EngineConfig

    app, engine = make_served_app(EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20,
                                               max_model_len=128, speculative="draft"), max_body_bytes=64 * 1024)
    with serve(app, engine) as s:
        model = httpx.get(s.url + "/v1/models").json()["data"][0]["id"]
        # self-speculation proposes drafts at every decode step (prompt lookup would need a match)
        r = httpx.post(s.url + "/v1/completions", json={"model": model, "prompt": [5, 6, 7, 8] * 6, "max_tokens": 24,
                                                         "ignore_eos": True}, timeout=60)
        assert r.status_code == 200
        text = httpx.get(s.url + "/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if not line.startswith("#")}
    drafts = values["traceless_spec_decode_num_draft_tokens_total"]
    accepted = values["traceless_spec_decode_num_accepted_tokens_total"]
    steps = values["traceless_spec_decode_num_verify_steps_total"]
    assert drafts > 0 and 0 <= accepted <= drafts and 0 < steps <= drafts
    assert drafts == engine.stats().spec["proposed"]
    assert "# TYPE traceless_spec_decode_num_draft_tokens_total counter" in text


def test_set_total_is_only_for_declared_counters():
    m = Metrics()
    m.set_total("traceless_spec_decode_num_accepted_tokens_total", 7)
    assert "traceless_spec_decode_num_accepted_tokens_total 7" in m.render()
    with pytest.raises(UnknownMetric):
        m.set_total("traceless_kv_cache_usage_ratio", 1)  # a gauge
