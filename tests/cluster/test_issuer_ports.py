"""The issuer's directory-only port: the gateway's way to the key, without the signing routes."""

import asyncio

import httpx

from traceless.privacy.privacypass.batch_issuance import ApiKeyStore
from traceless_tools.cluster.issuer import IssuerConfig, create_issuer_app
from traceless_tools.cluster.issuer_ports import DirectoryOnlyPort

SIGNING_PORT, DIRECTORY_PORT = 8091, 8094


def _get(app, port, method, path):
    async def run():
        # The ASGI transport puts the client-chosen URL's port in scope["server"], as uvicorn puts
        # the listening socket's port.
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://issuer:{port}") as client:
            return await client.request(method, path)

    return asyncio.run(run())


def _app():
    keys = ApiKeyStore({"user-1": "api-key-0123456789abcdef"})
    return DirectoryOnlyPort(create_issuer_app(IssuerConfig(10, 60.0, 10), keys), DIRECTORY_PORT)


def test_directory_port_serves_the_directory_and_nothing_else():
    app = _app()
    assert _get(app, DIRECTORY_PORT, "GET", "/token-issuer-directory").status_code == 200
    for method, path in (
        ("POST", "/token-request"),
        ("POST", "/token-request-batch"),
        ("POST", "/token-issuer-directory"),
        ("GET", "/anything"),
    ):
        response = _get(app, DIRECTORY_PORT, method, path)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


def test_signing_port_is_unchanged():
    app = _app()
    assert _get(app, SIGNING_PORT, "GET", "/token-issuer-directory").status_code == 200
    # The token route is there (it asks for an API key), unlike on the directory port.
    assert _get(app, SIGNING_PORT, "POST", "/token-request").status_code == 401
