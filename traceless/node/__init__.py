"""The private node: the only code that sees a request in plaintext, and the only code inside the
trust boundary besides the engine it runs. `identity` (keys and attestation), `service`
(decapsulate, run the OpenAI call, encapsulate), `app` (its four routes), `registration` (with the
gateway). It imports the server (the OpenAI API it runs), the engine through it, the HTTP boundary
and the privacy library; nothing of the untrusted cluster."""
