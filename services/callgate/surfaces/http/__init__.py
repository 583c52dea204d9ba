"""The HTTP API and the approval console (ADR 0017, ADR 0018).

A translation over the SDK's ``Gateway``: request → the same call the CLI makes →
response. Nothing here decides; the session is verified once per request to scope reads
to the bearer's tenant, and the decider verifies it again for what it decides.

Modules: ``app`` builds the FastAPI application; ``errors`` holds the one mapping of
vocabulary codes to HTTP statuses; ``deps`` the session dependency; ``models`` the
request and response bodies; ``routers/`` one router per resource; ``guard`` the
security middleware (headers, body size, rate limit); ``feed`` the pending-change feed
behind the event stream; ``metrics`` the Prometheus collector; ``server`` runs it all
under uvicorn for ``callgate serve --http``.
"""
