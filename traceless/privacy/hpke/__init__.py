"""Hybrid Public Key Encryption, base mode (RFC 9180): `kem`, `kdf`, `aead` wrap `cryptography`'s
primitives; `context` is the key schedule and the sender/recipient contexts."""
