"""What compliance reads: ``audit`` (and ``audit verify``), ``replay`` and ``effects``."""

from __future__ import annotations

import argparse

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_FAILED, EXIT_OK, Context, Misuse


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    au = add_command(
        sub, common, "audit", "the audit trail; `audit verify` checks its hash chains", audit
    )
    au.add_argument("action", nargs="?", choices=["verify"])
    au.add_argument("--invocation", help="only this invocation's records")
    au.add_argument(
        "--session", help="required to list records: only the session's tenant (an operator: all)"
    )
    add_command(sub, common, "replay", "rebuild every projection from the log and compare", replay)
    add_command(sub, common, "effects", "side effects of the simulated providers", effects)


def audit(ctx: Context) -> int:
    gate = ctx.gateway()
    if ctx.ns.action != "verify":
        if ctx.ns.session is None:
            raise Misuse("audit needs --session (records are shown for its tenant only)")
        ctx.out.audit(gate.audit(ctx.ns.invocation, session=ctx.ns.session))
        return EXIT_OK
    v = gate.verify_audit()
    ctx.out.verification(
        {"ok": v.ok, "records": v.records, "first_bad": v.first_bad, "reason": v.reason}
    )
    return EXIT_OK if v.ok else EXIT_FAILED


def replay(ctx: Context) -> int:
    from callgate.ops.replay import replay as rebuild

    report = rebuild(ctx.gateway(), ctx.out)
    ctx.out.value(report, human=lambda c: c.print_json(data=report))
    return EXIT_OK if report["equal"] else EXIT_FAILED


def effects(ctx: Context) -> int:
    ctx.out.effects(ctx.gateway().effects())
    return EXIT_OK
