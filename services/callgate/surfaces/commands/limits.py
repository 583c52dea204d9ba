"""``callgate usage`` and ``callgate limits reset|raise``: the usage of each limit per scope,
and an operator's change of one scope's usage as one event with author and reason
(ADR 0079)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_OK, Context

if TYPE_CHECKING:
    from rich.console import Console


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, common, "usage", "each limit's usage per scope (your tenant; operators: all)", usage
    )
    p.add_argument("--limit", help="only this limit")
    p.add_argument("--session", required=True, help="a session token")
    limits = sub.add_parser("limits", help="an operator's reset or raise of one scope's usage")
    actions = limits.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_text in (
        ("reset", "forget what one scope committed (calls in flight keep their hold)"),
        ("raise", "add to one scope's limit until its next reset"),
    ):
        q = add_command(actions, common, name, help_text, change)
        q.add_argument("limit", help="the limit's name in the profile")
        q.add_argument("--tenant", required=True, help="the scope's exact tenant")
        q.add_argument("--actor", help="the scope's exact actor (a limit per actor)")
        q.add_argument("--agent", help="the scope's exact agent (a limit per agent)")
        q.add_argument("--tool", help="the scope's exact tool (a limit per tool)")
        if name == "raise":
            q.add_argument("--by", type=int, required=True, help="what to add to the limit")
        q.add_argument("--reason", required=True, help="why (recorded on the event)")
        q.add_argument("--session", required=True, help="an operator's session token")


def usage(ctx: Context) -> int:
    rows = ctx.gateway().usage(ctx.ns.session, ctx.ns.limit)

    def human(c: Console) -> None:
        if not rows:
            c.print("no usage recorded")
            return
        for r in rows:
            scope = " ".join(f"{k}={v}" for k, v in r["scope"].items())
            window = f"{r['window_ms'] // 1000}s window" if r["window_ms"] else "in flight"
            c.print(
                f"{r['limit']:<24} {scope:<40} {r['used']:>10} of {r['max']:<10} "
                f"({r['held']} held; {window})",
                soft_wrap=True,
            )

    ctx.out.value({"usage": rows}, human)
    return EXIT_OK


def change(ctx: Context) -> int:
    ns = ctx.ns
    scope: dict[str, Any] = {
        k: getattr(ns, k) for k in ("tenant", "actor", "agent", "tool") if getattr(ns, k)
    }
    event = ctx.gateway().change_limit(
        ns.limit, scope, action=ns.action, reason=ns.reason, session=ns.session,
        raise_by=getattr(ns, "by", 0),
    )  # fmt: skip
    ctx.out.record(
        {
            "event": event.event_type,
            "event_id": event.event_id,
            "limit": event.limit,
            "scope_key": event.partition_key,
            "action": event.action,
            "raise_by": event.raise_by,
            "reason": event.reason,
            "author": event.author,
            "occurred_at": event.occurred_at,
        }
    )
    return EXIT_OK
