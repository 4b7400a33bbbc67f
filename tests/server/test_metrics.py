import pytest

from traceless.server.metrics import Metrics, UnknownMetric


def test_only_allowlisted_names_labels_and_values():
    m = Metrics()
    m.set_total("traceless_requests_total", 3, endpoint="completions", status="ok")
    with pytest.raises(UnknownMetric):
        m.set_total("traceless_prompts_seen_total", 1)  # not declared
    with pytest.raises(UnknownMetric):
        m.set_total("traceless_requests_total", 1, endpoint="completions", status="ok", user="alice")  # label
    with pytest.raises(UnknownMetric):
        m.set_total("traceless_requests_total", 1, endpoint="completions", status="what the user typed")  # value
    with pytest.raises(UnknownMetric):
        m.set("traceless_requests_total", 1.0)  # a counter, not a gauge
    with pytest.raises(UnknownMetric):
        m.set("traceless_window_time_to_first_token_seconds", 1.0, quantile="0.42")  # undeclared quantile


def test_prometheus_text_format():
    m = Metrics()
    m.set_total("traceless_requests_total", 40, endpoint="chat_completions", status="ok")
    m.set("traceless_window_time_to_first_token_seconds", 0.05, quantile="0.5")
    m.set("traceless_window_peak_kv_cache_usage_ratio", 0.25)
    text = m.render()
    assert 'traceless_requests_total{endpoint="chat_completions",status="ok"} 40.0' in text
    assert 'traceless_window_time_to_first_token_seconds{quantile="0.5"} 0.05' in text
    assert "traceless_window_peak_kv_cache_usage_ratio 0.25" in text
    assert "traceless_prompt_tokens_total 0.0" in text
    assert "# TYPE traceless_requests_total counter" in text
    assert "histogram" not in text and "_created" not in text  # nothing per request, no first-seen times
