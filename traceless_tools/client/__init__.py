"""Client side of the private path: PrivateClient and the local OpenAI proxy."""
