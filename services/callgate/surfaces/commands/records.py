"""What compliance reads: ``audit`` (``audit verify``, ``audit export``), ``replay`` and
``effects``."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_FAILED, EXIT_OK, Context, Misuse

_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    au = add_command(
        sub,
        common,
        "audit",
        "the audit trail; `audit verify` checks its hash chains, `audit export` writes them "
        "as JSON lines for a SIEM",
        audit,
    )
    au.add_argument("action", nargs="?", choices=["verify", "export"])
    au.add_argument("--invocation", help="only this invocation's records")
    au.add_argument(
        "--session",
        help="required to list or export records: only the session's tenant (an operator: "
        "all; export: operators only)",
    )
    au.add_argument(
        "--file", type=Path, help="verify: check this exported file on its own, not the views"
    )
    au.add_argument(
        "--format",
        choices=["cloudevents", "ocsf"],
        default="cloudevents",
        help="export: CloudEvents 1.0 (structured JSON) or OCSF API Activity (%(default)s)",
    )
    au.add_argument("--output", type=Path, help="export: append to this file (default: stdout)")
    au.add_argument("--name", help="export: a named exporter that resumes from its stored position")
    au.add_argument(
        "--since",
        help="export: start at records that occurred this long ago (30s, 15m, 2h, 7d)",
    )
    au.add_argument(
        "--follow", action="store_true", help="export: keep writing new records until stopped"
    )
    au.set_defaults(until_stopped=lambda ns: ns.action == "export" and ns.follow)
    add_command(sub, common, "replay", "rebuild every projection from the log and compare", replay)
    add_command(sub, common, "effects", "side effects of the simulated providers", effects)


def parse_since(text: str) -> int:
    """``30s``/``15m``/``2h``/``7d`` as milliseconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise Misuse(f"--since {text!r}: a whole number and a unit, s, m, h or d (e.g. 15m)")
    return int(match[1]) * _UNIT_S[match[2]] * 1000


def audit(ctx: Context) -> int:
    if ctx.ns.action == "export":
        return export(ctx)
    if ctx.ns.action == "verify":
        return verify_file(ctx) if ctx.ns.file is not None else verify(ctx)
    if ctx.ns.session is None:
        raise Misuse("audit needs --session (records are shown for its tenant only)")
    ctx.out.audit(ctx.gateway().audit(ctx.ns.invocation, session=ctx.ns.session))
    return EXIT_OK


def verify(ctx: Context) -> int:
    v = ctx.gateway().verify_audit()
    ctx.out.verification(
        {"ok": v.ok, "records": v.records, "first_bad": v.first_bad, "reason": v.reason}
    )
    return EXIT_OK if v.ok else EXIT_FAILED


def verify_file(ctx: Context) -> int:
    """An exported file on its own: every line's hash, the chains' continuity, the envelopes."""
    from callgate_projections.export import verify_lines

    path: Path = ctx.ns.file
    try:
        with path.open(encoding="utf-8") as f:
            v = verify_lines(line.rstrip("\n") for line in f)
    except (OSError, UnicodeDecodeError) as exc:
        raise Misuse(f"--file {path}: {exc}") from None
    where = None if v.line is None else f"line {v.line}" + (f" ({v.key})" if v.key else "")
    ctx.out.verification(
        {
            "ok": v.ok,
            "records": v.records,
            "first_bad": where,
            "line": v.line,
            "reason": v.reason,
            "continues": v.continues,
            "anchored": list(v.anchored),
        }
    )
    return EXIT_OK if v.ok else EXIT_FAILED


def export(ctx: Context) -> int:
    """Audit records as JSON lines (callgate.adapters.audit_export); ``--follow`` runs
    until SIGINT or SIGTERM."""
    from callgate.adapters.audit_export import Export, ExportMisuse, PositionStore

    if ctx.ns.session is None:
        raise Misuse("audit export needs --session (an operator's)")
    since_ms = None if ctx.ns.since is None else int(time.time() * 1000) - parse_since(ctx.ns.since)
    gate = ctx.gateway()
    session = ctx.ns.session
    gate.audit_chains(session)  # refuses a non-operator before anything is written
    stop = ctx.stop  # --follow: set on SIGTERM or SIGINT (the command line's handlers)
    job = Export(
        fmt=ctx.ns.format,
        read_records=lambda: gate.audit_chains(session),
        stdout=sys.stdout,
        output=ctx.ns.output,
        name=ctx.ns.name,
        store=PositionStore(ctx.settings.state_dir),
        since_ms=since_ms,
        follow=ctx.ns.follow,
        stop=stop,
    )
    try:
        written = job.run()
    except ExportMisuse as exc:
        raise Misuse(str(exc)) from None
    if ctx.ns.output is not None:
        summary = {"exported": written, "format": ctx.ns.format, "output": str(ctx.ns.output)}
        if ctx.ns.name is not None:
            summary["name"] = ctx.ns.name
        ctx.out.value(
            summary,
            human=lambda c: c.print(f"exported {written} audit records to {ctx.ns.output}"),
        )
    return EXIT_OK


def replay(ctx: Context) -> int:
    from callgate.application.replay import replay as rebuild

    report = rebuild(ctx.gateway(), ctx.out.counting)
    ctx.out.replay(report)
    return EXIT_OK if report["equal"] else EXIT_FAILED


def effects(ctx: Context) -> int:
    ctx.out.effects(ctx.gateway().effects())
    return EXIT_OK
