"""``callgate mcp``: serve callgate as an MCP server (docs/how-to/integrations.md, ADR 0019).

The MCP SDK is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_OK, Context, Misuse

if TYPE_CHECKING:
    from callgate.bootstrap import App


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    m = add_command(sub, common, "mcp", "serve callgate as an MCP server (stdio or HTTP)", mcp)
    m.set_defaults(until_stopped=lambda ns: not ns.http)  # HTTP: uvicorn's own handlers
    m.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="streamable HTTP, each request with its own bearer token (default: stdio)",
    )
    m.add_argument(
        "--session",
        metavar="TOKEN",
        help="stdio: the session token of every call (env CALLGATE_SESSION)",
    )
    m.add_argument(
        "--console-url",
        metavar="URL",
        help="the approval console named in approval_required answers (default: none)",
    )
    m.add_argument(
        "--hold",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="hold a tools/call that needs approval open up to this long for its final "
        "outcome, with progress notifications (ADR 0029; default 0: answer at once)",
    )


def check_providers(app: App) -> None:
    """The declared providers' settings, before anything is served (misuse if unusable)."""
    from callgate.domain.catalog import ProfileError

    try:
        app.providers  # noqa: B018
    except ValueError as e:
        raise ProfileError(f"profile {app.profile.source}: {e}") from e


def mcp(ctx: Context) -> int:
    ctx.needs_kafka_servers()
    app = ctx.app
    check_providers(app)
    from callgate.surfaces.mcp.drift import upstream_drift
    from callgate.surfaces.mcp.server import McpOptions

    options = McpOptions(
        session=ctx.ns.session or os.environ.get("CALLGATE_SESSION"),
        console_url=ctx.ns.console_url,
        timeout_s=app.settings.timeout_s,
        hold_s=max(0.0, ctx.ns.hold),
    )
    host = port = None
    if ctx.ns.http:
        host, sep, port = ctx.ns.http.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise Misuse(f"--http wants HOST:PORT, got {ctx.ns.http!r}")
    elif not options.session:
        raise Misuse("stdio needs the session token: --session TOKEN or CALLGATE_SESSION")
    for warning in upstream_drift(app):
        print(f"callgate mcp: warning: {warning}", file=sys.stderr)
    if host is not None and port is not None:
        from callgate.surfaces.mcp.serve import serve_http

        serve_http(app, options, host.strip("[]"), int(port))
        return EXIT_OK
    from callgate.surfaces.mcp.serve import serve_stdio

    serve_stdio(app, options, ctx.stop)
    return EXIT_OK
