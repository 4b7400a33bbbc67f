"""traceless's tools: everything outside the trusted core that a node runs. The private path's
untrusted hops (gateway, relay, issuer, transparency log: `cluster`), the client and its proxy
(`client`), the local deployment (`local`), audits and attacks (`audit`), benchmarks (`bench`),
reports (`report`) and evaluation (`eval`). They import the core (`traceless`); the core never
imports them, and a node's measured code digest covers the core alone."""
