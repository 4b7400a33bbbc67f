"""Attestation documents: JWS/EAT round trip, and every reason to refuse a node."""

import hashlib
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from traceless.privacy.attestation.measurement import Measurement
from traceless.privacy.attestation.software import (
    EAT_TYP,
    AttestationClaims,
    AttestationExpiredError,
    AttestationNotYetValidError,
    Attester,
    BadSignatureError,
    MalformedAttestationError,
    NodeStatement,
    NonceMismatchError,
    OhttpKeyMismatchError,
    SoftwareAttester,
    UnsupportedEvidenceError,
    UntrustedKeyError,
    b64url_decode,
    b64url_encode,
    jwk_thumbprint,
    new_claims,
    sign_document,
    verify_attestation,
)

NOW = 1_750_000_000
NONCE = b"n" * 16
KEY_CONFIG = b"\x01\x00\x20example-ohttp-keys-body"
MEASUREMENT = Measurement(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32)
STATEMENT = NodeStatement(MEASUREMENT, KEY_CONFIG, 4, "http://node.test:8100")


@pytest.fixture
def attester():
    return SoftwareAttester()


@pytest.fixture
def claims():
    return new_claims(STATEMENT, NONCE, NOW, "software", ttl_s=60)


def _parts(document):
    return document.split(".")


def _resign(key, header, payload):
    """A document signed correctly over arbitrary JSON (to test claim checks after the signature)."""
    head = b64url_encode(json.dumps(header).encode())
    body = b64url_encode(payload if isinstance(payload, bytes) else json.dumps(payload).encode())
    return f"{head}.{body}.{b64url_encode(key.sign(f'{head}.{body}'.encode()))}"


def test_rfc8037_examples():
    # RFC 8037 Appendix A.1-A.4: the Ed25519 key, its JWK thumbprint and the EdDSA JWS example.
    key = Ed25519PrivateKey.from_private_bytes(b64url_decode("nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"))
    assert b64url_encode(key.public_key().public_bytes_raw()) == "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"
    assert jwk_thumbprint(key.public_key()) == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
    signing_input = "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc"
    assert b64url_encode(key.sign(signing_input.encode())) == (
        "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg"
    )


def test_round_trip(attester, claims):
    document = attester.attest(claims)
    header = json.loads(b64url_decode(_parts(document)[0]))
    assert header == {"alg": "EdDSA", "typ": EAT_TYP, "kid": jwk_thumbprint(attester.public_key)}
    payload = json.loads(b64url_decode(_parts(document)[1]))
    assert set(payload) == {
        "eat_nonce",
        "iat",
        "exp",
        "measurements",
        "ohttp_keys_sha256",
        "attester_type",
        "capacity",
        "node_url",
        "evidence",
    }
    assert payload["capacity"] == 4 and payload["node_url"] == "http://node.test:8100" and payload["evidence"] == []
    assert payload["measurements"]["combined"] == MEASUREMENT.combined.hex()
    got = verify_attestation(document, [attester.public_key], NOW + 1, NONCE, ohttp_keys=KEY_CONFIG)
    assert got == claims and got.ohttp_keys_sha256 == hashlib.sha256(KEY_CONFIG).digest()
    raw = attester.public_key.public_bytes_raw()
    assert verify_attestation(document, [raw], NOW) == claims  # raw keys are accepted too


def test_tampering_breaks_the_signature(attester, claims):
    head, body, sig = _parts(attester.attest(claims))
    payload = json.loads(b64url_decode(body))
    payload["measurements"]["model"] = "00" * 32
    forged_body = b64url_encode(json.dumps(payload).encode())
    bad_sig = b64url_encode(bytes([b64url_decode(sig)[0] ^ 1]) + b64url_decode(sig)[1:])
    for document in (f"{head}.{forged_body}.{sig}", f"{head}.{body}.{bad_sig}"):
        with pytest.raises(BadSignatureError):
            verify_attestation(document, [attester.public_key], NOW)


def test_untrusted_key(attester, claims):
    document = attester.attest(claims)
    with pytest.raises(UntrustedKeyError):
        verify_attestation(document, [SoftwareAttester().public_key], NOW)
    with pytest.raises(UntrustedKeyError):
        verify_attestation(document, [], NOW)


def test_validity_period(attester, claims):
    document = attester.attest(claims)
    keys = [attester.public_key]
    verify_attestation(document, keys, NOW)
    verify_attestation(document, keys, NOW + 59.9)
    with pytest.raises(AttestationExpiredError):
        verify_attestation(document, keys, NOW + 60)
    with pytest.raises(AttestationNotYetValidError):
        verify_attestation(document, keys, NOW - 1)
    verify_attestation(document, keys, NOW - 1, leeway_s=5)


def test_nonce_and_key_config_binding(attester, claims):
    document = attester.attest(claims)
    with pytest.raises(NonceMismatchError):
        verify_attestation(document, [attester.public_key], NOW, b"m" * 16)
    with pytest.raises(OhttpKeyMismatchError):
        verify_attestation(document, [attester.public_key], NOW, NONCE, ohttp_keys=b"other")


@pytest.mark.parametrize(
    "document",
    [
        "",
        "a.b",
        "a.b.c.d",
        "!!.a.a",
        "e30.e30.=",
        12345,
        "eyJhbGciOiJFZERTQSJ9.e30.AA==",
    ],
)
def test_malformed_envelopes(attester, document):
    with pytest.raises(MalformedAttestationError):
        verify_attestation(document, [attester.public_key], NOW)


def test_malformed_headers_and_claims(attester, claims):
    key = attester._key  # the test plays an attester that signs whatever it is given
    kid = jwk_thumbprint(attester.public_key)
    good_header = {"alg": "EdDSA", "typ": EAT_TYP, "kid": kid}
    good = claims.to_json()
    headers = [
        {**good_header, "alg": "none"},
        {**good_header, "typ": "JWT"},
        {**good_header, "crit": ["exp"]},
        {"alg": "EdDSA", "typ": EAT_TYP},
    ]
    payloads = [
        {k: v for k, v in good.items() if k != "exp"},
        {**good, "eat_nonce": b64url_encode(b"short")},
        {**good, "exp": good["iat"]},
        {**good, "iat": "yesterday"},
        {**good, "measurements": {**good["measurements"], "combined": "00" * 32}},
        {**good, "measurements": {**good["measurements"], "code": "AB" * 32}},
        {**good, "attester_type": 7},
        b'{"iat": 1, "iat": 2}',
        b"[]",
    ]
    for header in headers:
        with pytest.raises(MalformedAttestationError):
            verify_attestation(_resign(key, header, good), [attester.public_key], NOW)
    for payload in payloads:
        with pytest.raises(MalformedAttestationError):
            verify_attestation(_resign(key, good_header, payload), [attester.public_key], NOW)


def test_b64url_is_strict():
    assert b64url_decode(b64url_encode(b"\xff\xfe")) == b"\xff\xfe"
    for bad in ("AA==", "A", "AB", "a+b/", " AA"):  # padding, bad length, non-canonical, alphabet
        with pytest.raises(MalformedAttestationError):
            b64url_decode(bad)


def test_claims_and_attester_constraints(attester, claims):
    with pytest.raises(ValueError):
        new_claims(STATEMENT, b"short", NOW, "software")
    other = AttestationClaims(NONCE, NOW, NOW + 1, MEASUREMENT, bytes(32), "sev-snp", 1, "")
    with pytest.raises(ValueError):
        attester.attest(other)
    assert attester.public_key != SoftwareAttester().public_key  # a fresh key per attester
    assert "PRIVATE" not in repr(attester) and jwk_thumbprint(attester.public_key) in repr(attester)
    with pytest.raises(TypeError):
        Attester()  # abstract


class _PluggedAttester(Attester):
    """Stands in for a hardware attester: same interface, its own type, its own key."""

    attester_type = "test-hardware"

    def __init__(self):
        self._key = Ed25519PrivateKey.generate()

    @property
    def public_key(self):
        return self._key.public_key()

    def attest(self, claims):
        return sign_document(self._key, claims)


def test_another_attester_plugs_in():
    plugged = _PluggedAttester()
    claims = new_claims(STATEMENT, NONCE, NOW, plugged.attester_type)
    got = verify_attestation(plugged.attest(claims), [plugged.public_key], NOW, NONCE)
    assert got.attester_type == "test-hardware"


def test_capacity_url_and_reserved_evidence_claims(attester, claims):
    key = Ed25519PrivateKey.generate()
    header = {"alg": "EdDSA", "typ": EAT_TYP, "kid": jwk_thumbprint(key.public_key())}
    good = claims.to_json()
    assert verify_attestation(_resign(key, header, good), [key.public_key()], NOW) == claims
    for change in (
        {"capacity": 0},
        {"capacity": 10**7},
        {"capacity": 2.0},
        {"capacity": True},
        {"node_url": 5},
        {"node_url": "http://x\n"},
    ):
        with pytest.raises(MalformedAttestationError):
            verify_attestation(_resign(key, header, {**good, **change}), [key.public_key()], NOW)
    for missing in ("capacity", "node_url", "evidence"):
        with pytest.raises(MalformedAttestationError):
            verify_attestation(
                _resign(key, header, {k: v for k, v in good.items() if k != missing}), [key.public_key()], NOW
            )
    # Hardware evidence is reserved: a verifier that cannot check it refuses it, never ignores it.
    with pytest.raises(UnsupportedEvidenceError):
        verify_attestation(_resign(key, header, {**good, "evidence": [{"kind": "sev-snp"}]}), [key.public_key()], NOW)
    with pytest.raises(ValueError):
        new_claims(NodeStatement(MEASUREMENT, KEY_CONFIG, 0), NONCE, NOW, "software")


def test_attester_policy():
    from traceless.privacy.attestation.policy import AttesterPolicy, AttesterTypeRefusedError, check_attester_type

    check_attester_type(AttesterPolicy.DEVELOPMENT, "software")
    with pytest.raises(AttesterTypeRefusedError, match="development policy"):
        check_attester_type(AttesterPolicy.PRODUCTION, "software")
    with pytest.raises(AttesterTypeRefusedError):
        check_attester_type(AttesterPolicy.DEVELOPMENT, "test-hardware")
