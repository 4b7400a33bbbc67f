"""Privacy Pass with publicly verifiable tokens: RSA blind signatures (`blind_rsa`, RFC 9474),
token type 2 issuance (`protocol`, RFC 9578), wire structures and HTTP authentication (RFC 9577),
redemption at the gateway (`verifier`) and rate-limited batch issuance at the issuer."""
