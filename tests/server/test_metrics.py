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
    assert value(after, "traceless_inter_token_latency_seconds_count") - value(before, "traceless_inter_token_latency_seconds_count") == 3
    for line in after.splitlines():  # nothing outside the declared families
        assert line.startswith("# ") or line.split("{")[0].split(" ")[0].startswith("traceless_")
