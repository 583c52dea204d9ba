"""``callgate freeze`` and ``callgate unfreeze``: stop (or restore) every call of one tool,
tenant or actor on every instance, as one event on the log (ADR 0054)."""

from __future__ import annotations

import argparse

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_OK, Context


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    for name, help_text, handler in (
        ("freeze", "refuse every call of a tool, tenant or actor (code frozen)", freeze),
        ("unfreeze", "lift a freeze", unfreeze),
    ):
        p = add_command(sub, common, name, help_text, handler)
        which = p.add_mutually_exclusive_group(required=True)
        which.add_argument("--tool", help="the tool's exact catalog name")
        which.add_argument("--tenant", help="the tenant's exact name")
        which.add_argument("--actor", help="the actor's exact user name")
        p.add_argument(
            "--reason", required=name == "freeze", default="", help="why (recorded on the event)"
        )
        p.add_argument("--session", required=True, help="an operator's session token")


def freeze(ctx: Context) -> int:
    return _publish(ctx, lift=False)


def unfreeze(ctx: Context) -> int:
    return _publish(ctx, lift=True)


def _publish(ctx: Context, *, lift: bool) -> int:
    ns = ctx.ns
    # argparse requires one of them; an empty one is refused by the gateway's checks.
    scope = next(s for s in ("tool", "tenant", "actor") if getattr(ns, s) is not None)
    value = getattr(ns, scope)
    event = ctx.gateway().freeze(scope, value, reason=ns.reason, session=ns.session, lift=lift)
    ctx.out.record(
        {
            "event": event.event_type,
            "event_id": event.event_id,
            "scope": event.scope,
            "value": event.value,
            "reason": event.reason,
            "author": event.author,
            "occurred_at": event.occurred_at,
        }
    )
    return EXIT_OK
