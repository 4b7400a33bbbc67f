"""The media types of Oblivious HTTP (RFC 9458 §9, draft-ietf-ohai-chunked-ohttp §7): the one place
every hop (node, gateway, relay, client, audits) takes them from."""

from __future__ import annotations

OHTTP_REQ = "message/ohttp-req"
OHTTP_RES = "message/ohttp-res"
OHTTP_CHUNKED_REQ = "message/ohttp-chunked-req"
OHTTP_CHUNKED_RES = "message/ohttp-chunked-res"
OHTTP_KEYS = "application/ohttp-keys"

REQUEST_MEDIA_TYPES = (OHTTP_REQ, OHTTP_CHUNKED_REQ)


def response_media_type(request_media_type: str) -> str:
    """A chunked request is answered chunked, a whole one whole."""
    return OHTTP_CHUNKED_RES if request_media_type == OHTTP_CHUNKED_REQ else OHTTP_RES
