"""How the inputs that change the decider's state by themselves change it: what the
executor reports, a limit's answer, a human decision's id (``evolve``, ADR 0092)."""

from __future__ import annotations

from typing import Any

from callgate.decider.copy_on_write import put, with_key, with_own_key, without_waiter
from callgate.decider.state import (
    ASKED,
    REFUSED,
    RESERVED,
    DeciderState,
    Invocation,
    KeyStatus,
    Phase,
    evolved,
    key_record,
)
from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json
from callgate.domain.codes import Code, failure_code


def decision_seen(state: DeciderState, e: ev.ApprovalDecisionSubmitted) -> DeciderState:
    if e.event_id in state.decisions_seen:
        return state
    seen = (*state.decisions_seen, e.event_id)
    return DeciderState(state.invocations, state.keys, state.approvals, seen)


def started(state: DeciderState, e: ev.ExecutionStarted) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None or inv.started_attempt >= e.attempt:
        return state
    return put(state, evolved(inv, started_attempt=e.attempt))


def dry_run_recorded(state: DeciderState, e: ev.DryRunRecorded) -> DeciderState:
    """The snapshot the execution follows (C5); one a human is asked to confirm is kept by
    its ``ApprovalRequested``."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None or inv.phase not in (Phase.CONFIRMING, Phase.DRY_RUN_THEN_EXECUTE):
        return state
    return put(state, evolved(inv, dry_run_json=e.snapshot_json, dry_run_hash=e.snapshot_hash))


def _settled(state: DeciderState, invocation_id: str, outcome: str, result: str) -> DeciderState:
    """C8: the outcome is stored on the call and on its key (its waiters are replayed)."""
    inv = state.invocations.get(invocation_id)
    if inv is None or (inv.phase == Phase.SETTLED and inv.outcome != Code.OUTCOME_UNCERTAIN):
        return state
    inv = evolved(inv, phase=Phase.SETTLED, outcome=outcome, result_json=result)
    state = put(state, inv)
    return with_own_key(state, inv, status=KeyStatus.DONE, outcome=outcome, result_json=result)


def succeeded(state: DeciderState, e: ev.ExecutionSucceeded) -> DeciderState:
    return _settled(state, e.invocation_id, Code.EXECUTED.value, e.result_json)


def failed(state: DeciderState, e: ev.ExecutionFailed) -> DeciderState:
    message = canonical_json({"error": e.message})
    return _settled(state, e.invocation_id, failure_code(e.code).value, message)


def uncertain(state: DeciderState, e: ev.ExecutionUncertain) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is not None and inv.phase == Phase.WAITING:
        return _lookup_failed(state, inv, e)
    if inv is None or inv.phase != Phase.EXECUTING:
        return state
    # The executor reports an outcome only for a run it started, so the attempt in force
    # has started even if its ExecutionStarted was not seen: the decider's two input
    # topics (``requests``, ``events``) are not ordered with each other. Without this the
    # reconciliation would never retry (calls left waiting forever).
    inv = evolved(
        inv,
        phase=Phase.SETTLED,
        outcome=Code.OUTCOME_UNCERTAIN.value,
        started_attempt=max(inv.started_attempt, inv.attempt),
    )
    return with_own_key(put(state, inv), inv, status=KeyStatus.UNCERTAIN)


def _lookup_failed(
    state: DeciderState, waiter: Invocation, e: ev.ExecutionUncertain
) -> DeciderState:
    """C12: a retry's reconciliation could not learn what became of the original call: the
    retry is ``outcome_uncertain``; the key stays uncertain when no one else waits (the
    next waiter, if any, asks again: ``key_records.on_lookup_failed``)."""
    rec = key_record(state, waiter)
    if (
        rec is None
        or rec.status != KeyStatus.RECONCILING
        or rec.execution_token != e.execution_token
        or waiter.invocation_id not in rec.waiters
    ):
        return state
    waiter = evolved(waiter, phase=Phase.SETTLED, outcome=Code.OUTCOME_UNCERTAIN.value)
    state = without_waiter(put(state, waiter), waiter)
    rec = key_record(state, waiter)
    if rec is None or any(w in state.invocations for w in rec.waiters):
        return state
    return with_key(state, waiter, status=KeyStatus.UNCERTAIN)


def reconciled(state: DeciderState, e: ev.ExecutionReconciled) -> DeciderState:
    """C12: what the provider said happened, recorded once per reconciliation."""
    original_id = e.original_invocation_id or e.invocation_id
    original = state.invocations.get(original_id)
    if original is None or e.event_id in original.reconciliations:
        return state
    original = evolved(original, reconciliations=(*original.reconciliations, e.event_id))
    state = put(state, original)
    if not e.found:
        return state
    original = evolved(
        original, phase=Phase.SETTLED, outcome=Code.EXECUTED.value, result_json=e.result_json
    )
    return with_own_key(
        put(state, original),
        original,
        status=KeyStatus.DONE,
        outcome=Code.EXECUTED.value,
        result_json=e.result_json,
    )


def usage_answered(state: DeciderState, e: ev.UsageReserved | ev.UsageRefused) -> DeciderState:
    """ADR 0079: a limit's answer, recorded on the reservation that asked for it."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None or inv.phase != Phase.RESERVING:
        return state
    changed = False
    usage: list[dict[str, Any]] = []
    for u in inv.usage:
        if u["id"] == e.reservation_id and u["state"] == ASKED and not changed:
            changed = True
            if isinstance(e, ev.UsageReserved):
                u = {**u, "used": e.used, "state": RESERVED, "over_limit": e.over_limit}
            else:
                u = {**u, "used": e.used, "state": REFUSED, "retry_after_ms": e.retry_after_ms}
        usage.append(u)
    return put(state, evolved(inv, usage=tuple(usage))) if changed else state


__all__ = [
    "decision_seen",
    "dry_run_recorded",
    "failed",
    "reconciled",
    "started",
    "succeeded",
    "uncertain",
    "usage_answered",
]
