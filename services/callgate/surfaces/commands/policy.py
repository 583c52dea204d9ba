"""``callgate policy``: simulate a candidate on the history, publish and activate versions
(rolling back is activating an earlier one), run one in shadow, read the history."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_OK, Context, Misuse

_UNITS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"([1-9][0-9]{0,8})([smhd])")

_ACTIONS = ("simulate", "publish", "activate", "history", "shadow")


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, common, "policy", "policy versions: simulate, publish, activate, shadow", policy
    )
    p.add_argument(
        "action",
        choices=_ACTIONS,
        help="simulate CANDIDATE: decide the history again; publish FILE: record a version; "
        "activate VERSION: decide with it (rollback: an earlier one); history: who, when, "
        "why; shadow VERSION | --off | report: decide live calls with it too",
    )
    p.add_argument(
        "target",
        nargs="?",
        help="a profile file (simulate, publish), a version (activate, shadow) or 'report'",
    )
    p.add_argument("--session", required=True, help="an operator's session token")
    p.add_argument("--reason", default="", help="why (publish, activate, shadow): recorded")
    p.add_argument("--off", action="store_true", help="shadow: stop the shadow version")
    p.add_argument("--since", metavar="DURATION", help="only decisions this recent (30m, 24h, 7d)")
    p.add_argument("--tenant", help="only this tenant's decisions (exact)")


def duration_ms(text: str) -> int:
    """``90s``, ``30m``, ``24h``, ``7d`` in milliseconds (anything else is misuse)."""
    found = _DURATION.fullmatch(text)
    if found is None:
        raise Misuse(f"--since {text!r}: expected a number and s, m, h or d (e.g. 24h)")
    return int(found.group(1)) * _UNITS_MS[found.group(2)]


def policy(ctx: Context) -> int:
    action = ctx.ns.action
    if action == "simulate":
        return simulate(ctx)
    if action == "publish":
        return publish(ctx)
    if action == "history":
        ctx.out.policy_history(ctx.gateway().policy_history(session=ctx.ns.session))
        return EXIT_OK
    if action == "activate":
        version = _target(ctx, "a version")
        event = ctx.gateway().activate_policy(version, reason=_reason(ctx), session=ctx.ns.session)
        ctx.out.record({"activated": version, "event_id": event.event_id})
        return EXIT_OK
    return shadow(ctx)


def _target(ctx: Context, what: str) -> str:
    target: str | None = ctx.ns.target
    if not target:
        raise Misuse(f"policy {ctx.ns.action} needs {what}")
    return target


def _reason(ctx: Context) -> str:
    reason: str = ctx.ns.reason
    if not reason.strip():
        raise Misuse(f"policy {ctx.ns.action} needs --reason (recorded in the history)")
    return reason


def simulate(ctx: Context) -> int:
    from callgate.adapters.profiles import load_profile

    since = ctx.ns.since
    since_ms = ctx.app.clock() - duration_ms(since) if since else None
    candidate = load_profile(Path(_target(ctx, "a candidate profile")))  # ProfileError: usage
    report = ctx.gateway().simulate(
        candidate, session=ctx.ns.session, tenant=ctx.ns.tenant, since_ms=since_ms
    )
    ctx.out.simulation(report.to_json())
    return EXIT_OK


def publish(ctx: Context) -> int:
    """Read the profile file and the policy file it names; the checking is the gateway's
    (a candidate that does not parse: ``policy_version_invalid``, nothing published)."""
    import yaml

    path = Path(_target(ctx, "a profile file"))
    reason = _reason(ctx)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Misuse(f"profile {path}: cannot read: {exc}") from None
    policy_text = ""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError:
        raw = None  # the gateway names the problem
    if isinstance(raw, dict) and isinstance(raw.get("policy_file"), str):
        policy_path = path.parent / raw["policy_file"]
        try:
            policy_text = policy_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise Misuse(f"profile {path}: policy_file {policy_path}: cannot read: {exc}") from None
    version = ctx.gateway().publish_policy(text, policy_text, reason=reason, session=ctx.ns.session)
    ctx.out.record({"published": version})
    return EXIT_OK


def shadow(ctx: Context) -> int:
    target: str | None = ctx.ns.target
    gate = ctx.gateway()
    if target == "report":
        ctx.out.shadow_report(gate.shadow_report(session=ctx.ns.session))
        return EXIT_OK
    if ctx.ns.off == bool(target):
        raise Misuse("policy shadow needs a VERSION, --off, or report")
    reason = ctx.ns.reason or ("shadow off" if ctx.ns.off else "shadow")
    version = None if ctx.ns.off else target
    event = gate.shadow_policy(version, reason=reason, session=ctx.ns.session)
    ctx.out.record({"shadow": version, "event_id": event.event_id})
    return EXIT_OK
