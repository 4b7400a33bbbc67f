"""The privacy library: protocols and their primitives, used by the server, the node, the cluster and
the client, importing none of them.

    hpke/         Hybrid Public Key Encryption (RFC 9180), on `cryptography`'s primitives
    bhttp/        Binary HTTP messages (RFC 9292), whole and streamed
    ohttp/        Oblivious HTTP (RFC 9458) and its chunked variant; key configurations; media types
    privacypass/  RSA blind signatures (RFC 9474) and Privacy Pass type 2 tokens (RFC 9576-9578)
    translog/     the transparency log: Merkle trees (RFC 9162), signed tree heads, client
    attestation/  measurement of a node and the attestation documents that carry it
    wire.py       bounded byte reading and QUIC varints (shared by bhttp and ohttp)
    errors.py     errors the encapsulation stack shares
"""
