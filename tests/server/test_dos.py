"""`traceless serve` under slowloris clients, 100 MiB bodies, 500 connections and a flood of bad
requests: honest requests keep being served, memory stays bounded (threat T28, docs/threat-model.md). Figures
are printed (pytest -s shows them)."""

import httpx

from tests import dos
from tests.support.serving import make_served_app, serve
from traceless.config import EngineConfig

JSON = {"content-type": "application/json"}


def test_serve_holds(tiny_llama_dir):
    app, engine = make_served_app(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128), "tiny"
    )
    with serve(app, engine, dos.TEST_LIMITS) as s:

        def honest():
            body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2, "ignore_eos": True}
            response = httpx.post(s.url + "/v1/completions", json=body, timeout=30)
            assert response.status_code == 200, (response.status_code, response.text)
            assert response.json()["usage"]["completion_tokens"] == 2

        unknown_field = b'{"model": "tiny", "prompt": "w5", "not_a_field": 1}'
        target = dos.Target(
            "serve", s.url, honest, ("POST", "/v1/completions", JSON, unknown_field), 400, ("/v1/completions", JSON)
        )
        dos.run_all(target)
        s.check_integrity()
