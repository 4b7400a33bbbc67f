"""The transparency log of release measurements: Merkle trees and proofs (`merkle`, RFC 9162),
signed tree heads, the append-only log (`log`) and the client that verifies it (`client`)."""
