"""``callgate mcp``: serve the MCP server over stdio or streamable HTTP.

stdio: one client (the agent that spawned the process), whose session token is the
configured one (``--session`` or ``CALLGATE_SESSION``). Streamable HTTP: any number of
clients, each request authenticated by its own ``Authorization: Bearer <token>``; a
request without one is answered ``401`` before it reaches the MCP server.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from callgate.bootstrap import App
from callgate.surfaces.mcp.bridge import GatewayBridge
from callgate.surfaces.mcp.server import McpOptions, build_server

ASGIApp = Any


def serve_stdio(app: App, options: McpOptions) -> None:
    from mcp.server.stdio import stdio_server

    bridge = GatewayBridge(app)
    server = build_server(bridge, options)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    try:
        asyncio.run(main())
    finally:
        bridge.close()


def http_app(app: App, options: McpOptions, host: str) -> tuple[ASGIApp, GatewayBridge]:
    """The ASGI application of ``callgate mcp --http`` (also what tests mount)."""
    bridge = GatewayBridge(app)
    server = build_server(bridge, options)
    starlette = server.streamable_http_app(host=host)
    return require_bearer(starlette), bridge


def serve_http(app: App, options: McpOptions, host: str, port: int) -> None:
    import uvicorn

    asgi, bridge = http_app(app, options, host)
    config = uvicorn.Config(asgi, host=host, port=port, log_level="warning", lifespan="on")
    try:
        uvicorn.Server(config).run()
    finally:
        bridge.close()


def require_bearer(inner: ASGIApp) -> ASGIApp:
    """Answer ``401 unauthenticated`` to HTTP requests that carry no bearer token.

    The token itself is verified where every call's is: by the decider (C6).
    """

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization", b"").decode("latin-1")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                body = json.dumps(
                    {
                        "error": {
                            "code": "unauthenticated",
                            "message": "send the session token as Authorization: Bearer <token>",
                        }
                    }
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b'Bearer realm="callgate"'),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await inner(scope, receive, send)

    return asgi
