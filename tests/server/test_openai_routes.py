"""One OpenAI route table (http/openai_routes.py): `serve`, the node and the proxy serve exactly it."""

from __future__ import annotations

from types import SimpleNamespace

from starlette.routing import Route

from tests.support.serving import make_served_app
from traceless.config import EngineConfig
from traceless.http.openai_routes import BY_PATH, OPENAI_ROUTES, RouteKind
from traceless.server.openai_api import OpenAIService
from traceless.server.telemetry import Telemetry
from traceless_tools.client.proxy import create_proxy_app
from traceless_tools.client.routing_watch import RoutingWatch


def _served(app) -> dict[str, set[str]]:
    return {r.path: set(r.methods or ()) - {"HEAD"} for r in app.routes if isinstance(r, Route)}


def test_the_table_is_consistent():
    assert len(BY_PATH) == len(OPENAI_ROUTES) == len({r.name for r in OPENAI_ROUTES})
    assert {r.method for r in OPENAI_ROUTES if r.kind is RouteKind.INFO} == {"GET"}
    assert {r.method for r in OPENAI_ROUTES if r.kind is not RouteKind.INFO} == {"POST"}


def test_serve_the_node_and_the_proxy_serve_every_route_of_the_table(tiny_llama_dir):
    app, engine = make_served_app(
        EngineConfig(model=str(tiny_llama_dir), dtype="float32", kv_cache_memory=2**20, max_model_len=64)
    )
    served = _served(app)
    for r in OPENAI_ROUTES:
        assert served[r.path] == {r.method}, r
    # the node dispatches by the table to the service's handlers: one for every route, no more
    service = OpenAIService(engine, "tiny", Telemetry(engine=engine))
    try:
        assert set(service.handlers()) == {r.name for r in OPENAI_ROUTES}
    finally:
        service.close()
    proxy = _served(create_proxy_app(SimpleNamespace(routing=RoutingWatch())))
    assert {p: m for p, m in proxy.items() if p in BY_PATH} == {r.path: {r.method} for r in OPENAI_ROUTES}
    assert set(proxy) - set(BY_PATH) == {"/health", "/status"}
