"""What a node runs and how it proves it: `measurement` (code, model and configuration digests)
and `software` (EAT documents signed by an in-memory key: the development attester).

Hardware evidence: `snp`, `tdx` and `nvidia` verify AMD SEV-SNP reports, Intel TDX quotes and
NVIDIA H100 attestation reports to pinned vendor roots, each returning an `evidence.VerificationResult`;
`tsm` and `nvml` collect that evidence on a node; `report` renders a result (docs/attestation.md)."""
