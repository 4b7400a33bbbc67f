"""Oblivious HTTP (RFC 9458) and chunked OHTTP: `keys` (key configurations), `encap` (request and
response encapsulation), `chunked`, `gateway` (the key holder's and the client's API) and `media`
(the media types every hop uses)."""
