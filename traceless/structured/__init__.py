"""Structured outputs: a request's output constrained by a JSON schema, a regex, a choice list or a
grammar (llguidance). `spec` is plain data; `grammar` compiles it and holds the per-request matcher."""
