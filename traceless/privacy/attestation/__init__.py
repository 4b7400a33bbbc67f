"""What a node runs and how it proves it: `measurement` (code, model and configuration digests)
and `software` (EAT documents signed by an in-memory key: the development attester)."""
