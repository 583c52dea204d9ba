"""Usage limits in the decider: ask, decide with the usage, settle (ADR 0079).

A call that limits cover is parked (``Phase.RESERVING``) once the checks up to identity
pass: one ``UsageReserveRequested`` per limit goes to the usage process, keyed by the
limit's scope. When every answer is in, the proposal is decided in that step with the
usage known: the policy reads it (``context.usage``), and after idempotency (a replay
counts nothing) a refused limit is ``limit_exceeded``; a limit whose ``over`` is
``approve`` turns the call into one an approver confirms.

Each invocation keeps its reservations (``Invocation.usage``, changed by ``evolve`` alone);
``settle`` gives each one back exactly once when the invocation's fate is known: committed
when it executed (or may have: ``outcome_uncertain``), released otherwise (refused,
replayed, waiting on its key, denied, expired, failed). The decider emits those from
``handle`` and ``due`` alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from callgate.decider.emitter import Emitter
from callgate.decider.state import ASKED, REFUSED, RESERVED, ApprovalStatus, Invocation, Phase
from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json, derive_id
from callgate.domain.codes import Code
from callgate.domain.principal import Principal
from callgate.domain.usage import UsageLimit, cedar_usage, exceeded

_RAN = frozenset({Code.EXECUTED.value, Code.OUTCOME_UNCERTAIN.value})


def ask(
    p: ev.ToolCallProposed,
    tool: str,
    principal: Principal,
    args: dict[str, Any],
    parked: dict[str, Any],
    limits: list[UsageLimit],
    out: Emitter,
) -> None:
    """Park the proposal ``p`` (``Phase.RESERVING``) and ask each limit's scope to hold
    what the call uses; each request carries what the proposal is decided from once every
    limit answers (``parked``: ``state.parked_fields`` and the resource facts)."""
    for limit in limits:
        key = limit.scope_key(principal.tenant, principal.user, principal.agent, tool)
        out.emit(
            ev.UsageReserveRequested,
            partition_key=key,
            limit=limit.name,
            reservation_id=derive_id("reservation", p.invocation_id, limit.name),
            amount=limit.amount(args),
            limit_max=limit.max,
            window_ms=limit.window_ms,
            over=limit.over,
            reply_key=p.partition_key,
            tool=tool,
            scope_json=canonical_json(
                limit.scope_of(principal.tenant, principal.user, principal.agent, tool)
            ),
            window=limit.window_name,
            **parked,
        )


def answered(e: ev.UsageReserved | ev.UsageRefused, out: Emitter) -> Invocation | None:
    """The invocation when ``e`` (recorded by ``evolve``) was the last answer it waited for."""
    waited = out.before.invocations.get(e.invocation_id)
    entry = _entry(waited, e.reservation_id)
    if (
        waited is None
        or entry is None
        or entry["state"] != ASKED
        or waited.phase != Phase.RESERVING
    ):
        if isinstance(e, ev.UsageReserved) and (entry is None or entry["state"] != RESERVED):
            # Held for nothing that waits for it: give it back at once.
            out.emit(
                ev.UsageReleased,
                partition_key=e.scope_key,
                limit=e.limit,
                reservation_id=e.reservation_id,
                reason="not waited for",
            )
        return None
    inv = out.state.invocations[e.invocation_id]
    if any(u["state"] == ASKED for u in inv.usage):
        return None
    return inv


def context(inv: Invocation | None) -> dict[str, dict[str, Any]]:
    """``context.usage`` for the policy: per limit, what was used before this call."""
    if inv is None:
        return {}
    return {u["limit"]: cedar_usage(u["used"], u["max"], u["window"]) for u in inv.usage}


def check(inv: Invocation, approved_by_approver: bool) -> bool:
    """Where the order of checks puts the limits (after idempotency): ``limit_exceeded``
    when a limit refused; True when a limit over which an approver decides was passed
    (the call then needs an approver) and no approver's approval came with it."""
    for u in inv.usage:
        if u["state"] == REFUSED:
            raise exceeded(u)
    over = any(u["state"] == RESERVED and u["over_limit"] for u in inv.usage)
    return over and not approved_by_approver


def usage_shown(inv: Invocation) -> str:
    """The usage an approver sees beside an approval a limit asked for."""
    return canonical_json(
        {
            u["limit"]: {
                "used": u["used"],
                "limit": u["max"],
                "window": u["window"],
                "amount": u["amount"],
                "over": u["over_limit"],
            }
            for u in inv.usage
        }
    )


def _entry(inv: Invocation | None, rid: str) -> dict[str, Any] | None:
    if inv is None:
        return None
    return next((u for u in inv.usage if u["id"] == rid), None)


def _fate(inv: Invocation) -> str | None:
    """ "commit", "release" or None (still held) for ``inv``'s reservations."""
    if inv.phase == Phase.SETTLED:
        return "commit" if inv.outcome in _RAN else "release"
    if inv.phase == Phase.WAITING:
        return "release"  # the call waits on its key's original: it runs nothing itself
    if inv.approval_status in (ApprovalStatus.DENIED, ApprovalStatus.EXPIRED):
        return "release"
    if inv.approval_status == ApprovalStatus.GRANTED and not inv.continue_on_approval:
        return "release"  # the agent resubmits: that call holds its own
    return None


def settle(ids: Iterable[str], out: Emitter) -> None:
    """Commit or release, once, the reservations of the invocations ``ids`` whose fate is
    known (a concurrency limit is released either way: the call is no longer in flight)."""
    for inv_id in dict.fromkeys(ids):
        inv = out.state.invocations.get(inv_id)
        if inv is None or not inv.usage:
            continue
        fate = _fate(inv)
        if fate is None:
            continue
        for u in inv.usage:
            if u["state"] != RESERVED:
                continue
            if fate == "commit" and u["window_ms"] > 0:
                out.emit(
                    ev.UsageCommitted,
                    invocation_id=inv_id,
                    partition_key=u["key"],
                    limit=u["limit"],
                    reservation_id=u["id"],
                    window_ms=u["window_ms"],
                )
            else:
                out.emit(
                    ev.UsageReleased,
                    invocation_id=inv_id,
                    partition_key=u["key"],
                    limit=u["limit"],
                    reservation_id=u["id"],
                    reason=inv.outcome or inv.approval_status or inv.phase,
                )


def touched(event: ev.Event, outputs: Iterable[object]) -> list[str]:
    """The invocations an input and its outputs concern."""
    ids = [event.invocation_id]
    ids += [o.invocation_id for o in outputs if isinstance(o, ev.Event)]
    return ids


__all__ = ["answered", "ask", "check", "context", "settle", "touched", "usage_shown"]
