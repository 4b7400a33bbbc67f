"""Typed errors for RSA blind signatures (RFC 9474) and Privacy Pass (RFC 9576-9578).

Every error carries `http_status`, the status a server should answer with when the error
reaches an HTTP boundary. Messages name what failed structurally ("blind_sig has the wrong
length"); they never contain keys, tokens, nonces, API keys or other secret values.
"""

from __future__ import annotations

from typing import ClassVar


class TokenError(Exception):
    """Base of every error raised by the token code."""

    http_status: ClassVar[int] = 400


class DecodeError(TokenError):
    """A wire structure, key encoding or header could not be parsed."""


class HeaderParseError(DecodeError):
    """An HTTP authentication header is malformed or lacks a required part."""


class UnsupportedTokenTypeError(TokenError):
    """The token_type is not one this code implements (only 0x0002, blind RSA)."""


class UnknownTokenKeyError(TokenError):
    """A (truncated) token key id does not name the issuer key in use."""


# --- RFC 9474 (names follow the errors listed in the RFC) -------------------------------


class BlindRSAError(TokenError):
    """Base of the RSABSSA errors."""


class MessageEncodingError(BlindRSAError):
    """EMSA-PSS-ENCODE failed: "encoding error" (modulus too small for hash and salt)."""


class InvalidInputError(BlindRSAError):
    """ "invalid input", "unexpected input size" or an out-of-range message representative."""


class BlindingError(BlindRSAError):
    """ "blinding error": the blind r has no inverse modulo n."""


class SigningFailureError(BlindRSAError):
    """ "signing failure": s^e mod n != m after RSASP1, so the signature was not released.

    This is the fault-attack safeguard: a faulty CRT signature would leak a factor of n.
    """

    http_status: ClassVar[int] = 500


class InvalidSignatureError(BlindRSAError):
    """ "invalid signature": RSASSA-PSS-VERIFY rejected the signature."""


# --- redemption (the verifier at the gateway) -------------------------------------------


class TokenRejectedError(TokenError):
    """A presented token was not accepted; subclasses say why."""

    http_status: ClassVar[int] = 401


class MalformedTokenError(TokenRejectedError):
    """The Authorization header or the Token structure could not be parsed."""


class TokenTypeError(TokenRejectedError):
    """The token's token_type is not the one this verifier accepts."""


class TokenKeyError(TokenRejectedError):
    """The token's token_key_id names no issuer key this verifier accepts."""


class ChallengeMismatchError(TokenRejectedError):
    """challenge_digest matches no challenge that is currently accepted (wrong or expired)."""


class TokenSignatureError(TokenRejectedError):
    """The token's authenticator is not a valid signature under the issuer key."""


class DoubleSpendError(TokenRejectedError):
    """The token's nonce was already redeemed inside its validity window."""


class SpentSetFullError(TokenError):
    """The spent-nonce set is at capacity with unexpired entries; new tokens are refused.

    Failing closed: forgetting an unexpired nonce would let that token be replayed.
    """

    http_status: ClassVar[int] = 503


# --- issuance service --------------------------------------------------------------------


class AuthenticationError(TokenError):
    """The API key presented to the issuer is not valid."""

    http_status: ClassVar[int] = 401


class RateLimitExceededError(TokenError):
    """The user's token quota for the current window would be exceeded by this batch."""

    http_status: ClassVar[int] = 429

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BatchSizeError(TokenError):
    """A batch of token requests is empty."""


class BatchTooLargeError(BatchSizeError):
    """A batch of token requests is larger than the service accepts in one call."""

    http_status: ClassVar[int] = 413
