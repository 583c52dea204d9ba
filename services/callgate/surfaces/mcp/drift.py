"""Does the catalog still describe the upstream? (checked when ``callgate mcp`` starts)

The catalog's argument schema is what callgate validates (C7, C10); the upstream's input
schema is what the upstream accepts. A reviewed entry copies the latter (``catalog draft
--mcp``), and upstreams change. These checks name what would make a permitted call fail
at the upstream: a tool it no longer lists, an argument it does not take, one it requires
that the catalog does not. They warn; the call itself still fails closed at the upstream
(``execution_failed``) and the catalog stays the authority.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from callgate.surfaces.ports import Surface


def schema_drift(catalog: Mapping[str, Any], upstream: Mapping[str, Any]) -> list[str]:
    """What the catalog's schema allows or omits that the upstream's would refuse."""
    problems: list[str] = []
    ours = set(catalog.get("properties") or {})
    theirs = set(upstream.get("properties") or {})
    closed = upstream.get("additionalProperties") is False or bool(theirs)
    if closed and (extra := sorted(ours - theirs)):
        problems.append(f"the catalog allows arguments the upstream does not take: {extra}")
    needed = set(upstream.get("required") or []) - set(catalog.get("required") or [])
    if needed:
        problems.append(
            f"the upstream requires arguments the catalog does not require: {sorted(needed)}"
        )
    return problems


def upstream_drift(app: Surface) -> list[str]:
    """Warnings for every catalog tool of an ``mcp`` provider that no longer fits it."""
    from callgate.providers.mcp import McpProvider

    warnings: list[str] = []
    for provider in app.providers.of_kind(McpProvider):
        try:
            listed = {t.name: t for t in provider.upstream.list_tools()}
        except Exception as exc:
            warnings.append(f"provider {provider.name!r}: cannot list the upstream's tools: {exc}")
            continue
        for name, spec in sorted(provider.tools.items()):
            if spec.upstream_method != "tools/call":  # a resource or prompt entry
                continue
            for role, tool in (
                ("upstream_tool", spec.upstream_name),
                ("dry_run_tool", spec.dry_run_tool),
                ("lookup_tool", spec.lookup_tool),
            ):
                if tool is not None and tool not in listed:
                    warnings.append(f"{name}: {role} {tool!r} is not listed by the upstream")
            upstream = listed.get(spec.upstream_name)
            if upstream is not None:
                for problem in schema_drift(spec.args_schema, upstream.input_schema):
                    warnings.append(f"{name}: {problem}")
    return warnings
