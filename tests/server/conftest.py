import pytest

from tests.support.serving import make_served_app, serve
from traceless.config import EngineConfig


@pytest.fixture(scope="module")
def tiny_server(tiny_llama_dir):
    app, engine = make_served_app(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=128),
        max_body_bytes=64 * 1024,
    )
    with serve(app, engine) as s:
        yield s


@pytest.fixture(scope="module")
def real_server():
    app, engine = make_served_app(EngineConfig(dtype="float32", kv_cache_memory=512 * 2**20))
    with serve(app, engine) as s:
        yield s
