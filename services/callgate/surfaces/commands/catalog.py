"""``callgate catalog``: the tools with their flags and argument schemas; ``catalog draft
--mcp``: entries drafted from an MCP server's ``tools/list``, for review; ``catalog pin``:
pin tools to the definitions their upstreams serve now (ADR 0066)."""

from __future__ import annotations

import argparse
from pathlib import Path

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_OK, Context, Misuse


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    c = add_command(sub, common, "catalog", "the tools with their flags and argument schemas", show)
    c.add_argument(
        "action",
        nargs="?",
        choices=["draft", "pin"],
        help="draft: entries from an MCP server; pin: pin the MCP upstreams' tools as served now",
    )
    c.add_argument("--mcp", metavar="COMMAND_OR_URL", help="draft: the upstream MCP server")
    c.add_argument("--provider", help="draft: provider name of the entries (default: upstream)")
    c.add_argument("--output", type=Path, metavar="FILE", help="draft: also write the YAML here")
    c.add_argument("--tool", help="pin: only this catalog tool (default: every MCP tool)")
    c.add_argument("--reason", help="pin: why (recorded)")
    c.add_argument("--session", help="pin: an operator's session token")


def show(ctx: Context) -> int:
    if ctx.ns.action == "draft":
        return draft(ctx)
    if ctx.ns.action == "pin":
        return pin(ctx)
    profile = ctx.app.profile
    ctx.out.catalog(profile.catalog_view(), profile.digest)
    return EXIT_OK


def draft(ctx: Context) -> int:
    if not ctx.ns.mcp:
        raise Misuse("catalog draft needs --mcp COMMAND_OR_URL")
    from callgate.surfaces.mcp.draft import draft_catalog

    text = draft_catalog(ctx.ns.mcp, ctx.ns.provider or "upstream")
    output: Path | None = ctx.ns.output
    if output is not None:
        output.write_text(text, encoding="utf-8")
    ctx.out.value(
        {"yaml": text, "output": str(output) if output else None},
        human=lambda c: c.print(text, markup=False, highlight=False, end=""),
    )
    return EXIT_OK


def pin(ctx: Context) -> int:
    from callgate.domain.events import ToolPinned

    ns = ctx.ns
    if not ns.session or not ns.reason:
        raise Misuse("catalog pin needs --session TOKEN and --reason TEXT")
    events = ctx.gateway().pin_tools(session=ns.session, reason=ns.reason, tool=ns.tool)
    ctx.out.record(
        {
            "pinned": {e.tool: e.digest for e in events if isinstance(e, ToolPinned)},
            "reason": ns.reason,
        }
    )
    return EXIT_OK
