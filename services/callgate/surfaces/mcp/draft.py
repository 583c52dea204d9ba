"""``callgate catalog draft --mcp <command-or-url>``: catalog entries from ``tools/list``.

A draft for an adopter to review, never a catalog to trust as is (C10: the catalog, not
the upstream, says what a tool may do). Every entry carries the strict defaults: a
high-impact mutation that needs a dry-run and an approver, callable by no role yet, on
the target named by its first required argument (so the resource directory applies).
The upstream's input schema becomes the argument schema; its annotations (read-only,
destructive hints) are written as comments only, because a server's hints are not
authority.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from callgate.providers.mcp_upstream import McpUpstream, McpUpstreamConfig


def draft_catalog(target: str, provider: str) -> str:
    config = McpUpstreamConfig.from_target(target)
    upstream = McpUpstream(provider, config)
    try:
        tools = upstream.list_tools()
    finally:
        upstream.close()
    declared: dict[str, Any] = {"kind": "mcp"}
    if config.url is not None:
        declared["url"] = config.url
    else:
        declared["command"] = list(config.command or ())
    entries: dict[str, Any] = {}
    hints: list[str] = []
    for tool in tools:
        name = f"{provider}.{re.sub(r'[^A-Za-z0-9_.:-]', '_', tool.name)}"
        schema = dict(tool.input_schema)
        required = [r for r in schema.get("required", []) if isinstance(r, str)]
        entries[name] = {
            "description": (tool.description or "").strip().splitlines()[0]
            if tool.description
            else "",
            "provider": provider,
            "upstream_tool": tool.name,
            "mutation": True,
            "impact": "high",
            "require_dry_run": True,
            "dry_run_tool": None,
            "lookup_tool": None,
            "confirmation": "approver",
            "target_arg": required[0] if required else None,
            "identity_args": [],
            "callers": [],
            "approvers": [f"{provider}-approver"],
            "args_schema": schema,
        }
        a = tool.annotations
        if a is not None and (a.read_only_hint or a.destructive_hint is not None):
            hints.append(
                f"#   {name}: upstream hints read_only={a.read_only_hint} "
                f"destructive={a.destructive_hint}"
            )
    header = [
        f"# Draft catalog entries for the MCP upstream {target!r} ({len(entries)} tools).",
        "# Review every entry before use: each has the strict defaults (a high-impact",
        "# mutation needing a dry-run and an approver) and no callers, so no session may",
        "# call it yet. Name each tool's dry_run_tool (required while require_dry_run) and",
        "# lookup_tool (reconciliation), its target and identity arguments, and who calls",
        "# and approves it. Merge both sections into your profile.",
        *(["# Upstream annotations (hints, not authority):", *hints] if hints else []),
    ]
    body = yaml.safe_dump(
        {"providers": {provider: declared}, "tools": entries}, sort_keys=False, width=100
    )
    return "\n".join(header) + "\n" + body
