"""``callgate mcp``: serve the MCP server over stdio or streamable HTTP.

stdio: one client (the agent that spawned the process), whose session token is the
configured one (``--session`` or ``CALLGATE_SESSION``). Streamable HTTP: any number of
clients, each request authenticated by its own ``Authorization: Bearer <token>``; a
request without one is answered ``401`` before it reaches the MCP server.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

from mcp.shared.message import SessionMessage
from mcp.types import jsonrpc_message_adapter as _adapter
from starlette.responses import JSONResponse

from callgate.application import pinning
from callgate.bootstrap import App
from callgate.domain.codes import Rejection
from callgate.surfaces.mcp.bridge import GatewayBridge
from callgate.surfaces.mcp.server import McpOptions, build_server
from callgate.surfaces.strict_body import StrictJsonBody, check_body, jsonrpc_refusal

ASGIApp = Any


def watch_pins(app: App, bridge: GatewayBridge) -> None:
    """The pinning watcher beside the server (ADR 0066), through the bridge's gateway."""
    interval = app.settings.pinning.check_interval_s
    check = lambda: bridge.call(lambda g: g.record_definitions())  # noqa: E731
    pinning.watch(app.providers, check, interval, bridge.closed)


# On SIGTERM or SIGINT, calls in progress get this long to finish before the process ends
# (a call cut short is recovered like any crash: its invocation is on the log, C12).
STOP_GRACE_S = 5.0


def end_on_stop(stop: threading.Event, bridge: GatewayBridge) -> None:
    """Once ``stop`` is set: close the gateway (its calls in progress get ``STOP_GRACE_S``),
    then end the process. The stdio transport cannot be stopped from outside: its reader
    waits on the agent's input, and the MCP SDK's task group absorbs the first
    cancellation, so ``asyncio``'s own Ctrl-C handling stops it only sometimes."""
    stop.wait()
    closing = threading.Thread(target=bridge.close, daemon=True)
    closing.start()
    closing.join(STOP_GRACE_S)
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(0)


def serve_stdio(app: App, options: McpOptions, stop: threading.Event) -> None:
    """Serve over stdio until the client closes it or ``stop`` is set (SIGTERM/SIGINT)."""
    import anyio
    from mcp.server.stdio import stdio_server

    bridge = GatewayBridge(app)
    server = build_server(bridge, options)
    watch_pins(app, bridge)
    threading.Thread(target=end_on_stop, args=(stop, bridge), daemon=True).start()

    async def main() -> None:
        stdin = anyio.wrap_file(
            io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape")
        )
        refused_out, refused_in = anyio.create_memory_object_stream[dict[str, Any]](64)
        strict = StrictLines(stdin, refused_out)
        async with stdio_server(stdin=strict) as (read, write):  # type: ignore[arg-type]

            async def answer_refused() -> None:
                async with refused_in:
                    async for error in refused_in:
                        await write.send(SessionMessage(_adapter.validate_python(error)))

            async with anyio.create_task_group() as tg:
                tg.start_soon(answer_refused)
                await server.run(read, write, server.create_initialization_options())
                tg.cancel_scope.cancel()

    try:
        asyncio.run(main())
    finally:
        bridge.close()


def http_app(app: App, options: McpOptions, host: str) -> tuple[ASGIApp, GatewayBridge]:
    """The ASGI application of ``callgate mcp --http`` (also what tests mount)."""
    bridge = GatewayBridge(app)
    server = build_server(bridge, options)
    watch_pins(app, bridge)
    starlette = server.streamable_http_app(host=host)
    return require_bearer(StrictJsonBody(starlette, refuse=_refused_http)), bridge


def _refused_http(rejection: Rejection, body: bytes) -> ASGIApp:
    """``400`` with the JSON-RPC parse error (``data.code``: ``invalid_request``)."""
    return JSONResponse(jsonrpc_refusal(rejection, body), status_code=400)


class StrictLines:
    """The stdio transport's input, read line by line by the strict reader: a refused line
    never reaches the MCP SDK's parser; its JSON-RPC error goes to ``refused``."""

    def __init__(self, lines: Any, refused: Any) -> None:
        self._lines = lines
        self._refused = refused

    def __aiter__(self) -> AsyncIterator[str]:
        return self._strict()

    async def _strict(self) -> AsyncIterator[str]:
        async with self._refused:
            async for line in self._lines:
                if not line.strip():
                    continue
                refused = check_body(line)
                if refused is None:
                    yield line
                else:
                    await self._refused.send(jsonrpc_refusal(refused, line))


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
