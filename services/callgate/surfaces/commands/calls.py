"""The calls of agent platforms and approval UIs: ``propose``, ``pending``, ``approve``,
``deny`` and ``status``. Each is one SDK call (``callgate.surfaces.sdk.Gateway``)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_FAILED, EXIT_OK, Context, Misuse


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    pr = add_command(
        sub, common, "propose", "propose a tool call and wait until it settles", propose
    )
    pr.add_argument("--session", required=True, help="the caller's session token")
    pr.add_argument("--tool", required=True, help="the tool's name in the catalog")
    pr.add_argument("--args", required=True, help="the tool's arguments, a JSON object")
    pr.add_argument("--idempotency-key", help="replays the stored result of the same call (C8)")
    pr.add_argument("--approval-id", help="the approval that confirms this call (C4, C11)")
    pr.add_argument(
        "--wait",
        type=duration,
        metavar="DURATION",
        help="when the call needs approval, wait this long (90s, 10m, 1h) for its final "
        "outcome (ADR 0029)",
    )
    pr.add_argument(
        "--traceparent",
        default=None,
        help="the caller's W3C trace context: the call's trace continues it (default: "
        "$TRACEPARENT; with [tracing] on, ADR 0036)",
    )

    wa = add_command(sub, common, "wait", "wait for an invocation's final outcome", wait)
    wa.add_argument("invocation_id")
    wa.add_argument("--session", required=True, help="the proposing session's token")
    wa.add_argument(
        "--wait", type=duration, default=600.0, metavar="DURATION", help="how long (600s)"
    )

    pe = add_command(sub, common, "pending", "pending approvals", pending)
    pe.add_argument(
        "--session", required=True, help="reads show only the session's tenant (an operator: all)"
    )

    ap = add_command(sub, common, "approve", "approve a pending call", approve)
    ap.add_argument("invocation_id")
    ap.add_argument("--session", required=True, help="the approver's session token")

    de = add_command(sub, common, "deny", "deny a pending call", deny)
    de.add_argument("invocation_id")
    de.add_argument("--session", required=True, help="the approver's session token")
    de.add_argument("--reason", default="", help="why (recorded in the audit trail)")

    st = add_command(sub, common, "status", "status of one invocation", status)
    st.add_argument("invocation_id")
    st.add_argument(
        "--session", required=True, help="reads show only the session's tenant (an operator: all)"
    )


def propose(ctx: Context) -> int:
    from callgate.domain.codes import Rejection
    from callgate.domain.limits import parse_args

    ns = ctx.ns
    limits = ctx.app.profile.entry_limits
    try:  # the strict reader of every entry (domain/limits.py)
        parse_args(ns.args, limits.max_args_bytes, limits.max_depth)
    except Rejection as e:
        if e.details.get("limit") in ("syntax", "type"):
            raise Misuse(f"--args must be a JSON object: {e.message}") from None
        # Over a limit: the gateway answers it as a refused call, exit 0 like any refusal.
    shown: list[Callable[[dict[str, Any]], None] | None] = []

    def progress(status: dict[str, Any]) -> None:
        """A line per change while the call is waited on (made at the first status, which
        names the invocation)."""
        if not shown:
            shown.append(ctx.out.progress(str(status.get("invocation_id")), ns.wait))
        if shown[0] is not None:
            shown[0](status)

    # With --wait, ``Gateway.propose`` answers the final outcome in one shape, whether the
    # call is final when first seen (an approval given that quickly) or becomes final.
    answer = ctx.gateway().propose(
        ns.session,
        ns.tool,
        ns.args,
        idempotency_key=ns.idempotency_key,
        approval_id=ns.approval_id,
        timeout_s=ctx.settings.timeout_s,
        wait=ns.wait,
        traceparent=ns.traceparent or os.environ.get("TRACEPARENT"),
        on_change=progress,
    )
    ctx.out.answer(answer)
    return EXIT_OK if answer.get("settled") else EXIT_FAILED


def wait(ctx: Context) -> int:
    return _wait(ctx, ctx.ns.invocation_id, ctx.ns.wait)


def _wait(ctx: Context, invocation_id: str, seconds: float) -> int:
    """``Gateway.wait``, with a line per change of state on a terminal's stderr."""
    progress = ctx.out.progress(invocation_id, seconds)
    answer = ctx.gateway().wait(invocation_id, ctx.ns.session, seconds, on_change=progress)
    ctx.out.answer(answer)
    return EXIT_OK if answer.get("settled") else EXIT_FAILED


def duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``1500ms``, ``10m`` or ``1h``."""
    import re

    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 10m, 1h)")
    scale = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "h": 3600.0}[m.group(2)]
    return float(m.group(1)) * scale


def pending(ctx: Context) -> int:
    ctx.out.pending(ctx.gateway().pending(ctx.ns.session))
    return EXIT_OK


def approve(ctx: Context) -> int:
    d = ctx.gateway().approve(ctx.ns.invocation_id, ctx.ns.session, ctx.settings.timeout_s)
    keys = ("approval_id", "invocation_id", "expires_at", "outcome", "granted", "required")
    ctx.out.approval({k: d[k] for k in keys if k in d})
    return EXIT_OK


def deny(ctx: Context) -> int:
    ns = ctx.ns
    d = ctx.gateway().deny(ns.invocation_id, ns.session, ns.reason, ctx.settings.timeout_s)
    ctx.out.denial(
        {"invocation_id": d["invocation_id"], "denied": True, "reason": d.get("reason", "")}
    )
    return EXIT_OK


def status(ctx: Context) -> int:
    from callgate.domain.codes import Code, Rejection

    found = ctx.gateway().status_or_undecided(ctx.ns.invocation_id, ctx.ns.session)
    if found is None:
        raise Rejection(Code.NOT_FOUND, f"no invocation {ctx.ns.invocation_id}")
    ctx.out.status(found)
    return EXIT_OK
