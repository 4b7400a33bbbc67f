"""The one HTTP boundary every traceless service is built on (server, node, gateway, relay, issuer,
log, proxy): OpenAI-shaped JSON errors, capped bodies, media types, the app factory with its
route-error handlers, the endpoint wrapper that emits schema events, forwarding to upstreams, and
running an app under uvicorn. Imports only the base layer (errors, events) and privacy's media
types; nothing of the engine."""
