"""``callgate policy simulate``: decide the recorded history again under a candidate profile."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_OK, Context, Misuse

_UNITS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"([1-9][0-9]{0,8})([smhd])")


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    p = add_command(sub, common, "policy", "what a candidate policy would change", simulate)
    p.add_argument("action", choices=["simulate"], help="simulate: decide the history again")
    p.add_argument("candidate", type=Path, help="the candidate profile (catalog and policy)")
    p.add_argument("--session", required=True, help="an operator's session token")
    p.add_argument("--since", metavar="DURATION", help="only decisions this recent (30m, 24h, 7d)")
    p.add_argument("--tenant", help="only this tenant's decisions (exact)")


def duration_ms(text: str) -> int:
    """``90s``, ``30m``, ``24h``, ``7d`` in milliseconds (anything else is misuse)."""
    found = _DURATION.fullmatch(text)
    if found is None:
        raise Misuse(f"--since {text!r}: expected a number and s, m, h or d (e.g. 24h)")
    return int(found.group(1)) * _UNITS_MS[found.group(2)]


def simulate(ctx: Context) -> int:
    from callgate.domain.catalog import load_profile

    since = ctx.ns.since
    since_ms = ctx.app.clock() - duration_ms(since) if since else None
    candidate = load_profile(ctx.ns.candidate)  # ProfileError: a usage error naming the file
    report = ctx.gateway().simulate(
        candidate, session=ctx.ns.session, tenant=ctx.ns.tenant, since_ms=since_ms
    )
    ctx.out.simulation(report.to_json())
    return EXIT_OK
