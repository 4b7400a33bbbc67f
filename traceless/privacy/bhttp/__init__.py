"""Binary HTTP (RFC 9292): `message` (known-length requests and responses), `fields`, and
`stream` (indeterminate-length responses, written and read chunk by chunk)."""
