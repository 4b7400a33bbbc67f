"""The token issuer over real loopback HTTP: directory, single and batch issuance that clients
finalize into verifiable tokens, API-key auth, rate limits, malformed input, and no state kept
per token."""

import json
import math

import httpx
import pytest

from tests.support.cluster_services import running_app
from traceless.privacy.privacypass import protocol as privacypass
from traceless.privacy.privacypass.batch_issuance import ApiKeyStore
from traceless.privacy.privacypass.errors import DecodeError
from traceless.privacy.privacypass.http import b64url_decode
from traceless.privacy.privacypass.keys import IssuerPublicKey
from traceless.privacy.privacypass.token_batch import decode_batch, encode_batch
from traceless.privacy.privacypass.wire import TOKEN_TYPE_BLIND_RSA, TokenChallenge, TokenRequest
from traceless_tools.cluster.issuer import IssuerConfig, create_issuer_app, load_api_keys

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"
CHALLENGE = TokenChallenge(TOKEN_TYPE_BLIND_RSA, "issuer.test", b"\x07" * 32, "")
SINGLE = {"content-type": "message/token-request"}
BATCH = {"content-type": "application/private-token-batch-request"}


class Clock:
    def __init__(self, now=1_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture(scope="module")
def issuer():
    return privacypass.Issuer.generate()


def _served(issuer, config, clock=None):
    app = create_issuer_app(config, ApiKeyStore({"alice": ALICE, "bob": BOB}), issuer=issuer, clock=clock or Clock())
    return app, running_app(app)


@pytest.fixture
def served(issuer):
    """(app, http client, clock) with a roomy quota."""
    clock = Clock()
    app, server = _served(issuer, IssuerConfig(tokens_per_window=1000, window_seconds=60), clock)
    with server as url, httpx.Client(base_url=url, timeout=10) as http:
        yield app, http, clock


def _auth(key):
    return {"authorization": f"Bearer {key}"}


def _begin(key: IssuerPublicKey, n: int):
    return [privacypass.begin(CHALLENGE, key) for _ in range(n)]


def _directory_key(http) -> IssuerPublicKey:
    body = http.get("/token-issuer-directory").json()
    (entry,) = body["token-keys"]
    return IssuerPublicKey.from_spki(b64url_decode(entry["token-key"], "token-key"))


def test_directory(served, issuer):
    _, http, _ = served
    response = http.get("/token-issuer-directory")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/private-token-issuer-directory")
    body = response.json()
    assert body["issuer-request-uri"] == "/token-request"
    assert body["token-keys"][0]["token-type"] == 2
    assert _directory_key(http).token_key_id == issuer.public_key.token_key_id


def test_single_issuance_gives_a_token_that_verifies(served):
    _, http, _ = served
    key = _directory_key(http)
    ((request, state),) = _begin(key, 1)
    response = http.post("/token-request", content=request.encode(), headers={**SINGLE, **_auth(ALICE)})
    assert response.status_code == 200
    assert response.headers["content-type"] == "message/token-response"
    token = privacypass.finalize(state, privacypass.TokenResponse.decode(response.content))
    privacypass.verify_token(token, key)


def test_batch_issuance_keeps_order_and_every_token_verifies(served):
    _, http, _ = served
    key = _directory_key(http)
    pairs = _begin(key, 6)
    body = encode_batch([request.encode() for request, _ in pairs])
    response = http.post("/token-request-batch", content=body, headers={**BATCH, **_auth(BOB)})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/private-token-batch-response"
    items = decode_batch(response.content)
    assert len(items) == 6
    tokens = set()
    for (_, state), item in zip(pairs, items):  # finalize fails if a response is out of order
        token = privacypass.finalize(state, privacypass.TokenResponse.decode(item))
        privacypass.verify_token(token, key)
        tokens.add(token.nonce)
    assert len(tokens) == 6


@pytest.mark.parametrize(
    "headers", [{}, _auth("not-a-key-0123456789"), {"authorization": f"Basic {ALICE}"}, {"authorization": "Bearer"}]
)
def test_missing_or_bad_api_key_is_401(served, headers):
    app, http, _ = served
    ((request, _),) = _begin(app.state.service.issuer_key, 1)
    for path, kind in (("/token-request", SINGLE), ("/token-request-batch", BATCH)):
        body = request.encode() if path == "/token-request" else encode_batch([request.encode()])
        response = http.post(path, content=body, headers={**kind, **headers})
        assert response.status_code == 401
        assert response.headers["www-authenticate"].startswith("Bearer")
        assert response.json()["error"]["type"] == "authentication_error"
    assert app.state.service.rate_limiter.snapshot() == {}


def test_rate_limit_429_then_recovery_after_the_window(issuer):
    clock = Clock(60.0 * 16_667)  # a multiple of the window: the window starts now
    app, server = _served(issuer, IssuerConfig(tokens_per_window=3, window_seconds=60), clock)
    key = issuer.public_key
    with server as url, httpx.Client(base_url=url, timeout=10) as http:

        def batch(n, api_key=ALICE):
            body = encode_batch([r.encode() for r, _ in _begin(key, n)])
            return http.post("/token-request-batch", content=body, headers={**BATCH, **_auth(api_key)})

        assert batch(2).status_code == 200
        over = batch(2)  # all or nothing: 1 left, 2 asked
        assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limit_exceeded"
        assert over.headers["retry-after"] == "60"
        assert batch(1).status_code == 200
        clock.now += 20.5
        limited = batch(1)
        assert limited.status_code == 429 and limited.headers["retry-after"] == str(math.ceil(39.5))
        assert batch(1, BOB).status_code == 200  # per user
        clock.now += 40
        assert batch(3).status_code == 200
        assert batch(1).status_code == 429


def _wrong_key_request(key):
    request, _ = privacypass.begin(CHALLENGE, key)
    return TokenRequest(2, (request.truncated_token_key_id + 1) % 256, request.blinded_msg).encode()


def _cases(key):
    good = privacypass.begin(CHALLENGE, key)[0].encode()
    return [
        ("/token-request", SINGLE, b"", 400),
        ("/token-request", SINGLE, good[:-1], 400),
        ("/token-request", SINGLE, good + b"\x00", 400),
        ("/token-request", SINGLE, b"\x00\x01" + good[2:], 400),  # token type 1
        ("/token-request", SINGLE, _wrong_key_request(key), 400),
        ("/token-request", {"content-type": "application/json"}, good, 415),
        ("/token-request", {}, good, 415),
        ("/token-request", SINGLE, good * 300, 413),
        ("/token-request-batch", BATCH, b"", 400),  # empty batch
        ("/token-request-batch", BATCH, encode_batch([good])[:-3], 400),  # truncated item
        ("/token-request-batch", BATCH, encode_batch([good]) + b"\x01", 400),  # dangling length
        ("/token-request-batch", BATCH, b"\x00\x00" + encode_batch([good]), 400),  # empty item
        ("/token-request-batch", BATCH, encode_batch([good, good[:100]]), 400),  # short item
        ("/token-request-batch", BATCH, encode_batch([good] * 101), 413),  # over the body cap
        ("/token-request-batch", BATCH, encode_batch([b"x"] * 101), 413),  # over max_batch
        ("/token-request-batch", SINGLE, encode_batch([good]), 415),
    ]


def test_malformed_requests_are_refused_and_count_nothing(served):
    app, http, _ = served
    for path, kind, body, status in _cases(app.state.service.issuer_key):
        response = http.post(path, content=body, headers={**kind, **_auth(ALICE)})
        assert response.status_code == status, (path, status)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert app.state.service.rate_limiter.snapshot() == {}


def test_unknown_routes_and_methods(served):
    _, http, _ = served
    assert http.get("/token-request").status_code == 405
    assert http.get("/nope").status_code == 404
    assert http.get("/token-issuer-directory/").status_code == 404


def _reachable(root):
    """Every object reachable from root through attributes, slots and containers."""
    seen, stack, out = set(), [root], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type) or callable(obj) and not hasattr(obj, "__slots__"):
            continue
        seen.add(id(obj))
        out.append(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        else:
            for name in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, name):
                    stack.append(getattr(obj, name))
            stack.extend(getattr(obj, "__dict__", {}).values())
    return out


def test_issuer_keeps_per_user_counters_and_nothing_per_token(served):
    app, http, clock = served
    service = app.state.service
    key = service.issuer_key
    sent, received = [], []
    for api_key, n in ((ALICE, 5), (BOB, 3), (ALICE, 4)):
        requests = [r.encode() for r, _ in _begin(key, n)]
        response = http.post(
            "/token-request-batch", content=encode_batch(requests), headers={**BATCH, **_auth(api_key)}
        )
        sent += requests
        received += decode_batch(response.content)
    window = math.floor(clock.now / 60)
    assert service.rate_limiter.snapshot() == {"alice": (window, 9), "bob": (window, 3)}
    held = [obj for obj in _reachable(service) if isinstance(obj, (bytes, bytearray, str))]
    for item in sent + received:
        assert not any(item[3:] in bytes(x) if isinstance(x, (bytes, bytearray)) else False for x in held)
    assert ALICE not in held and BOB not in held  # only digests of API keys
    assert not any(isinstance(obj, (list, set)) and obj for obj in _reachable(service))


def test_load_api_keys_file(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({ALICE: "alice", BOB: "bob"}))
    store = load_api_keys(path)
    assert store.authenticate(ALICE) == "alice" and store.authenticate(BOB) == "bob"
    for content in (
        "[1]",
        "{",
        json.dumps({ALICE: "alice", BOB: "alice"}),
        json.dumps({"short": "u"}),
        json.dumps({ALICE: 3}),
    ):
        path.write_text(content)
        with pytest.raises(ValueError):
            load_api_keys(path)


def test_default_body_limit_fits_a_full_batch_and_no_more(issuer):
    good = privacypass.begin(CHALLENGE, issuer.public_key)[0].encode()
    config = IssuerConfig(max_batch=7)
    assert config.body_limit == len(encode_batch([good] * 7))
    assert IssuerConfig(max_body_bytes=10).body_limit == 10
    with pytest.raises(ValueError):
        IssuerConfig(max_body_bytes=0)


def test_batch_framing_round_trip_and_limits():
    items = [b"a", b"bc" * 300, b"\x00" * 259]
    assert decode_batch(encode_batch(items)) == items
    assert decode_batch(b"") == []
    with pytest.raises(DecodeError):
        encode_batch([b""])
    with pytest.raises(DecodeError):
        encode_batch([b"x" * 65536])


def test_an_unknown_api_key_is_refused_before_the_body_is_read(served):
    """A flood with bad API keys costs the issuer a key lookup each, never a body."""
    from tests.cluster import _raw as raw

    _, http, _ = served
    for path in ("/token-request", "/token-request-batch"):
        with raw.connect(str(http.base_url), timeout_s=3) as sock:
            sock.sendall(
                raw.head(
                    "POST",
                    path,
                    {
                        "authorization": "Bearer not-a-key-at-all-000",
                        "content-type": "application/private-token-request",
                        "content-length": "20000",
                    },
                )
            )  # and no body
            assert raw.read_status(sock) == 401
