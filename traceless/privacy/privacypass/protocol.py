"""Privacy Pass issuance for token type 2, blind RSA 2048 (RFC 9578 section 6).

    client                                           issuer
    req, state = begin(challenge, issuer_key)  -- TokenRequest -->
                                                     resp = issuer.issue(req)
                                             <-- TokenResponse --
    token = finalize(state, resp)
    ... later, to the origin: Authorization: PrivateToken token=<token>

The issuer signs a blinded message and never sees the nonce, the challenge or the token,
so it cannot link a token it later meets to the issuance that produced it. Token type 2
uses RSABSSA-SHA384-PSS-Deterministic: the token input already starts with a fresh 32-byte
nonce, so the message needs no extra randomizing prefix (RFC 9578 section 6.1).

Other files: privacypass_wire.py (structures), privacypass_keys.py (SPKI, token_key_id),
privacypass_http.py (RFC 9577 headers), privacypass_verifier.py (redemption at the gateway),
token_issuance.py (API-key authenticated, rate-limited batch issuance).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from cryptography.hazmat.primitives.asymmetric import rsa

from traceless.privacy.privacypass import blind_rsa
from traceless.privacy.privacypass.blind_rsa import Variant
from traceless.privacy.privacypass.errors import (
    InvalidSignatureError,
    TokenKeyError,
    TokenSignatureError,
    UnknownTokenKeyError,
    UnsupportedTokenTypeError,
)
from traceless.privacy.privacypass.keys import TOKEN_KEY_BITS, IssuerPublicKey
from traceless.privacy.privacypass.wire import (
    NONCE_LEN,
    TOKEN_TYPE_BLIND_RSA,
    Token,
    TokenChallenge,
    TokenRequest,
    TokenResponse,
    token_input,
)

VARIANT = Variant.SHA384_PSS_DETERMINISTIC


class Issuer:
    """Holds one token signing key and answers TokenRequests (RFC 9578 section 6.2).

    The key must serve this protocol only (RFC 9578 section 6.5, RFC 9474 section 6.2).
    repr shows the token_key_id, never key material.
    """

    __slots__ = ("_private_key", "_public_key")

    def __init__(self, private_key: rsa.RSAPrivateKey) -> None:
        if not isinstance(private_key, rsa.RSAPrivateKey) or private_key.key_size != TOKEN_KEY_BITS:
            raise ValueError(f"token type 2 needs an RSA-{TOKEN_KEY_BITS} private key")
        self._private_key = private_key
        self._public_key = IssuerPublicKey.from_public_key(private_key.public_key())

    @classmethod
    def generate(cls) -> Issuer:
        """A fresh RSA-2048 key pair with e = 65537."""
        return cls(rsa.generate_private_key(public_exponent=65537, key_size=TOKEN_KEY_BITS))

    @property
    def public_key(self) -> IssuerPublicKey:
        return self._public_key

    def private_key_pem(self) -> bytes:
        """The signing key as unencrypted PKCS#8 PEM, for the issuer's own key file (0600)."""
        from cryptography.hazmat.primitives import serialization

        return self._private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def issue(self, token_request: TokenRequest) -> TokenResponse:
        """BlindSign the request after the RFC's checks (type, key id, size); 400s on failure.

        blind_sign checks s^e == m before anything is returned (fault-attack safeguard).
        """
        if token_request.token_type != TOKEN_TYPE_BLIND_RSA:
            raise UnsupportedTokenTypeError("TokenRequest: unsupported token_type")
        if token_request.truncated_token_key_id != self._public_key.truncated_token_key_id:
            raise UnknownTokenKeyError("truncated_token_key_id does not name this issuer's key")
        return TokenResponse(blind_rsa.blind_sign(self._private_key, token_request.blinded_msg))

    def __repr__(self) -> str:
        return f"Issuer(token_key_id={self._public_key.token_key_id.hex()})"


@dataclass(frozen=True, slots=True)
class ClientState:
    """What the client keeps between begin() and finalize(); use it once, send it nowhere.

    inv links the request to the token, so nothing here appears in repr.
    """

    issuer_key: IssuerPublicKey = field(repr=False)
    nonce: bytes = field(repr=False)
    challenge_digest: bytes = field(repr=False)
    inv: int = field(repr=False)


def begin(
    challenge: TokenChallenge,
    issuer_key: IssuerPublicKey,
    *,
    nonce: bytes | None = None,
    salt: bytes | None = None,
    r: int | None = None,
) -> tuple[TokenRequest, ClientState]:
    """Client-to-issuer request (RFC 9578 section 6.1).

    nonce, salt and r are for known-answer tests only; production callers leave them out
    and all three are drawn from the OS CSPRNG.
    """
    if challenge.token_type != TOKEN_TYPE_BLIND_RSA:
        raise UnsupportedTokenTypeError("TokenChallenge: unsupported token_type")
    if nonce is None:
        nonce = secrets.token_bytes(NONCE_LEN)
    elif len(nonce) != NONCE_LEN:
        raise ValueError(f"nonce must be {NONCE_LEN} bytes")
    challenge_digest = challenge.digest()
    msg = token_input(nonce, challenge_digest, issuer_key.token_key_id)
    blinded = blind_rsa.blind(VARIANT, issuer_key.public_key, msg, salt=salt, r=r)
    request = TokenRequest(TOKEN_TYPE_BLIND_RSA, issuer_key.truncated_token_key_id, blinded.blinded_msg)
    return request, ClientState(issuer_key, nonce, challenge_digest, blinded.inv)


def finalize(state: ClientState, response: TokenResponse) -> Token:
    """Unblind and verify the issuer's signature, giving the Token (RFC 9578 section 6.3).

    Raises InvalidSignatureError if the response does not unblind to a valid signature.
    """
    key_id = state.issuer_key.token_key_id
    msg = token_input(state.nonce, state.challenge_digest, key_id)
    authenticator = blind_rsa.finalize(VARIANT, state.issuer_key.public_key, msg, response.blind_sig, state.inv)
    return Token(TOKEN_TYPE_BLIND_RSA, state.nonce, state.challenge_digest, key_id, authenticator)


def verify_token(token: Token, issuer_key: IssuerPublicKey) -> None:
    """Token Verification (RFC 9578 section 6.4): RSASSA-PSS-VERIFY over the token input.

    Only the signature and key id: the challenge and double-spend checks are the
    verifier's (privacypass_verifier.py).
    """
    if token.token_key_id != issuer_key.token_key_id:
        raise TokenKeyError("token_key_id does not match the issuer key")
    try:
        blind_rsa.verify(VARIANT, issuer_key.public_key, token.authenticator_input(), token.authenticator)
    except InvalidSignatureError:
        raise TokenSignatureError("token authenticator is not a valid signature") from None
