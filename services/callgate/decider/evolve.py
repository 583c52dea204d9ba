"""``evolve(state, event) -> state``: the one place the decider's state changes (ADR 0092).

Pure and total: it reads the event and the state before it, nothing else (no profile, no
policy, no keys, no clock), so the state a runner stores for a partition key is the fold
of ``evolve`` over that key's events in the order the decider saw them: each input, then
the events it emitted for it. Restoring a key's state is that fold; it never asks a
provider. The rules (``decide``) only read state and emit events; the ``Emitter`` folds
each one as it is emitted, so a rule that reads after emitting sees the change.

Inputs that change state by themselves are folded here too: a reported start, dry-run,
outcome or reconciliation, a limit's answer, a human's decision (its id, against a
second delivery). An event that changes nothing returns the same object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from callgate.decider.state import (
    ApprovalStatus,
    ApprovalUse,
    DeciderState,
    Invocation,
    KeyRecord,
    KeyStatus,
    Phase,
    evolved,
)
from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json
from callgate.domain.codes import Code, evaluation_outcome, failure_code

# A reservation's states in ``Invocation.usage`` (``decider.limits``).
ASKED, RESERVED, REFUSED, COMMITTED, RELEASED = (
    "asked",
    "reserved",
    "refused",
    "committed",
    "released",
)

E = TypeVar("E", bound=ev.Event)


def evolve(state: DeciderState, event: ev.Event) -> DeciderState:
    """``state`` after ``event`` (the same object when it changes nothing)."""
    fold = _FOLDS.get(type(event))
    return state if fold is None else fold(state, event)


# -- copy-on-write helpers -------------------------------------------------------------


# The state is built positionally (its frozen ``__init__`` is what each event pays for it);
# a record is changed by ``evolved`` (a named tuple's ``_replace``, without its Python work).


def _put(state: DeciderState, inv: Invocation) -> DeciderState:
    invocations = {**state.invocations, inv.invocation_id: inv}
    return DeciderState(invocations, state.keys, state.approvals, state.decisions_seen)


def _put_key(state: DeciderState, key: str, rec: KeyRecord | None) -> DeciderState:
    keys = dict(state.keys)
    if rec is None:
        del keys[key]
    else:
        keys[key] = rec
    return DeciderState(state.invocations, keys, state.approvals, state.decisions_seen)


def _put_use(state: DeciderState, jti: str, use: ApprovalUse) -> DeciderState:
    approvals = {**state.approvals, jti: use}
    return DeciderState(state.invocations, state.keys, approvals, state.decisions_seen)


def _key_of(state: DeciderState, inv: Invocation) -> KeyRecord | None:
    return state.keys.get(inv.idempotency_key) if inv.idempotency_key is not None else None


def _with_key(state: DeciderState, inv: Invocation, **changes: Any) -> DeciderState:
    """``inv``'s key record with ``changes`` (none: unchanged)."""
    rec = _key_of(state, inv)
    if rec is None:
        return state
    return _put_key(state, inv.idempotency_key or "", evolved(rec, **changes))


def _key_status(state: DeciderState, inv: Invocation, status: str) -> DeciderState:
    """The key's status, when ``inv`` is the call its key names."""
    rec = _key_of(state, inv)
    if rec is None or rec.invocation_id != inv.invocation_id:
        return state
    return _put_key(state, inv.idempotency_key or "", evolved(rec, status=status))


def _authorized(state: DeciderState, inv: Invocation) -> DeciderState:
    """C8: the call passed every check, so its key names it: a record for a key not held
    (or held by an expired approval's call), ``executing`` until its next step says."""
    key = inv.idempotency_key
    if key is None:
        return state
    rec = state.keys.get(key)
    if rec is not None and (
        rec.status != KeyStatus.EXPIRED or rec.invocation_id == inv.invocation_id
    ):
        return state
    fresh = KeyRecord(
        actor=inv.actor,
        tool=inv.tool,
        target=inv.target,
        fingerprint=inv.fingerprint,
        invocation_id=inv.invocation_id,
        status=KeyStatus.EXECUTING,
    )
    return _put_key(state, key, fresh)


def _without_waiter(state: DeciderState, inv: Invocation) -> DeciderState:
    rec = _key_of(state, inv)
    if rec is None or inv.invocation_id not in rec.waiters:
        return state
    waiters = tuple(w for w in rec.waiters if w != inv.invocation_id)
    return _put_key(state, inv.idempotency_key or "", evolved(rec, waiters=waiters))


def _consume(state: DeciderState, jti: str, inv: Invocation) -> DeciderState:
    """C11: the approval is used by ``inv`` (single use)."""
    use = state.approvals.get(jti)
    if use is None:
        return state
    return _put_use(
        state, jti, evolved(use, consumed_by=inv.invocation_id, consumer_key=inv.idempotency_key)
    )


# -- the decider's outputs ---------------------------------------------------------------


def _rejected(state: DeciderState, e: ev.ProposalRejected) -> DeciderState:
    """Settled with ``code``; what it held is given back: the approval it used, its place
    among a key's waiters, the key it was authorized under (a corrected call may use it)."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None:  # refused before any other record: who asked, as far as known (C9)
        fresh = Invocation(
            e.invocation_id,
            Phase.SETTLED,
            e.code,
            partition_key=e.partition_key,
            tool=e.tool,
            actor=e.actor,
            tenant=e.tenant,
            agent=e.agent,
            delegation=e.delegation,
        )
        return _put(state, fresh)
    inv = evolved(inv, phase=Phase.SETTLED, outcome=e.code)
    state = _put(state, inv)
    use = state.approvals.get(inv.approval_jti) if inv.approval_jti else None
    if use is not None and use.consumed_by == inv.invocation_id:
        state = _put_use(state, inv.approval_jti, evolved(use, consumed_by="", consumer_key=None))
    rec = _key_of(state, inv)
    if rec is not None and inv.invocation_id in rec.waiters:
        return _without_waiter(state, inv)
    if rec is not None and rec.invocation_id == inv.invocation_id:
        return _put_key(state, inv.idempotency_key or "", None)
    return state


def _decided(state: DeciderState, e: ev.PolicyDecided) -> DeciderState:
    """The call as decided (C1): with the catalog's confirmation settings of that moment
    and the reservations it waited for."""
    waited = state.invocations.get(e.invocation_id)
    allowed = e.decision == "permit"
    if e.evaluate_only:  # ADR 0083: the decision is the answer
        outcome = evaluation_outcome(allowed, e.confirmation).value
    else:
        outcome = Code.ALLOWED.value if allowed else Code.TOOL_FORBIDDEN.value
    inv = Invocation(
        e.invocation_id,
        Phase.SETTLED,
        outcome,
        partition_key=e.partition_key,
        tool=e.tool,
        actor=e.actor,
        tenant=e.tenant,
        target=e.target,
        args_json=e.args_json,
        args_hash=e.args_hash,
        fingerprint=e.fingerprint,
        policy_version=e.policy_version,
        idempotency_key=e.idempotency_key,
        confirmation=e.confirmation,
        approver_roles=e.approver_roles,
        allow_self_approval=e.allow_self_approval,
        approval_ttl_ms=e.approval_ttl_ms,
        continue_on_approval=e.continue_on_approval,
        require_dry_run=e.require_dry_run,
        approvals_required=e.approvals_required,
        usage=() if waited is None else waited.usage,
        agent=e.agent,
        delegation=e.delegation,
        evaluate_only=e.evaluate_only,
        access_request=e.access_request,
    )
    return _put(state, inv)


def _parked(
    e: ev.ResourceDescriptionRequested | ev.UsageReserveRequested,
    phase: str,
    partition_key: str,
    proposal_event_id: str,
    **extra: Any,
) -> Invocation:
    """A proposal parked until a provider or a limit answers: what it is decided from
    once answered, as the request carries it."""
    return Invocation(
        e.invocation_id,
        phase,
        "",
        partition_key=partition_key,
        tool=e.tool,
        actor=e.actor,
        tenant=e.tenant,
        target=e.target,
        args_json=e.args_json,
        idempotency_key=e.idempotency_key,
        roles=e.roles,
        session_id=e.session_id,
        session_expires_at=e.session_expires_at,
        agent=e.agent,
        delegation=e.delegation,
        approval_id=e.approval_id,
        proposal_event_id=proposal_event_id,
        evaluate_only=e.evaluate_only,
        access_request=e.access_request,
        **extra,
    )


def _describing(state: DeciderState, e: ev.ResourceDescriptionRequested) -> DeciderState:
    """C7: parked until the provider says who owns the target."""
    return _put(state, _parked(e, Phase.DESCRIBING, e.partition_key, e.causation_id))


def _reserving(state: DeciderState, e: ev.UsageReserveRequested) -> DeciderState:
    """ADR 0079: parked until each limit answers; one reservation per request."""
    entry: dict[str, Any] = {
        "limit": e.limit,
        "id": e.reservation_id,
        "key": e.partition_key,
        "amount": e.amount,
        "max": e.limit_max,
        "window_ms": e.window_ms,
        "window": e.window,
        "over": e.over,
        "state": ASKED,
        "used": 0,
        "retry_after_ms": 0,
        "over_limit": False,
    }
    inv = state.invocations.get(e.invocation_id)
    if inv is not None and inv.phase == Phase.RESERVING:
        return _put(state, evolved(inv, usage=(*inv.usage, entry)))
    # A described proposal keeps the id of the proposal it was described for.
    proposal = e.causation_id if inv is None else inv.proposal_event_id
    parked = _parked(
        e, Phase.RESERVING, e.reply_key, proposal, facts_json=e.facts_json, usage=(entry,)
    )
    return _put(state, parked)


def _confirmed(state: DeciderState, e: ev.ConfirmationAccepted) -> DeciderState:
    """C5, C11: the approval is used by this call; an evaluation it confirms is permitted
    (ADR 0090); a same-key retry that completes another's confirmed call names it (C9)."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    if inv.phase == Phase.WAITING:  # a retry taking over the original's call
        return _put(state, evolved(inv, approval_jti=e.approval_jti))
    state = _authorized(state, inv)
    inv = evolved(inv, approval_jti=e.approval_jti, approved_dry_run_hash=e.dry_run_hash)
    if e.evaluate_only:
        inv = evolved(inv, phase=Phase.SETTLED, outcome=Code.PERMITTED.value)
    return _consume(_put(state, inv), e.approval_jti, inv)


def _dry_run_requested(state: DeciderState, e: ev.DryRunRequested) -> DeciderState:
    """C5: confirming an approval against a fresh dry-run, a dry-run before asking for
    one, or a mandatory dry-run before the execution."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    if e.approval_jti:
        inv = evolved(
            inv,
            phase=Phase.CONFIRMING,
            approval_jti=e.approval_jti,
            approved_dry_run_hash=e.approved_dry_run_hash,
        )
        return _consume(_put(_authorized(state, inv), inv), e.approval_jti, inv)
    if e.confirmation and e.confirmation != "none":
        inv = evolved(inv, phase=Phase.AWAITING_DRY_RUN, confirmation=e.confirmation)
        state = _put(_authorized(state, inv), inv)
        return _key_status(state, inv, KeyStatus.PENDING_APPROVAL)
    inv = evolved(inv, phase=Phase.DRY_RUN_THEN_EXECUTE)
    return _put(_authorized(state, inv), inv)


def _approval_requested(state: DeciderState, e: ev.ApprovalRequested) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    inv = evolved(
        inv,
        phase=Phase.PENDING_APPROVAL,
        outcome=Code.APPROVAL_REQUIRED.value,
        confirmation=e.confirmation,
        dry_run_json=e.dry_run_json,
        dry_run_hash=e.dry_run_hash,
        approval_status=ApprovalStatus.PENDING,
        approval_expires_at=e.expires_at,
    )
    state = _put(_authorized(state, inv), inv)
    return _key_status(state, inv, KeyStatus.PENDING_APPROVAL)


def _execution_requested(state: DeciderState, e: ev.ExecutionRequested) -> DeciderState:
    """The call runs (attempt ``e.attempt``); its key names it, ``executing``."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    inv = evolved(
        inv,
        phase=Phase.EXECUTING,
        outcome=Code.ALLOWED.value,
        execution_token=e.execution_token,
        attempt=e.attempt,
    )
    invocations = {**state.invocations, inv.invocation_id: inv}
    key = inv.idempotency_key
    if key is None:  # one state built per event: this is every call's path
        return DeciderState(invocations, state.keys, state.approvals, state.decisions_seen)
    rec = _authorized(state, inv).keys[key]
    rec = evolved(
        rec,
        status=KeyStatus.EXECUTING,
        execution_token=e.execution_token,
        invocation_id=inv.invocation_id,
        waiters=tuple(w for w in rec.waiters if w != inv.invocation_id),
    )
    keys = {**state.keys, key: rec}
    return DeciderState(invocations, keys, state.approvals, state.decisions_seen)


def _replayed(state: DeciderState, e: ev.ReplayServed) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    inv = evolved(inv, phase=Phase.SETTLED, outcome=Code.REPLAYED.value)
    return _without_waiter(_put(state, inv), inv)


def _awaiting(state: DeciderState, e: ev.ReplayAwaited) -> DeciderState:
    """C8: the call waits on its key's original, to be replayed (or to fail) with it."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    inv = evolved(inv, phase=Phase.WAITING, outcome=Code.ALLOWED.value)
    state = _put(state, inv)
    rec = _key_of(state, inv)
    if rec is None or inv.invocation_id in rec.waiters:
        return state
    return _with_key(state, inv, waiters=(*rec.waiters, inv.invocation_id))


def _reconciling(state: DeciderState, e: ev.ReconciliationRequested) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    return _with_key(state, inv, status=KeyStatus.RECONCILING)


def _grant_recorded(state: DeciderState, e: ev.ApprovalGrantRecorded) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    return _put(state, evolved(inv, grants=(*inv.grants, e.approver)))


def _granted(state: DeciderState, e: ev.ApprovalGranted) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    inv = evolved(inv, approval_status=ApprovalStatus.GRANTED)
    use = ApprovalUse(inv.invocation_id, ApprovalStatus.GRANTED, e.expires_at, approver=e.approver)
    state = _put_use(_put(state, inv), e.approval_jti, use)
    return _key_status(state, inv, KeyStatus.APPROVED)


def _denied(state: DeciderState, e: ev.ApprovalDenied) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    inv = evolved(inv, approval_status=ApprovalStatus.DENIED)
    return _key_status(_put(state, inv), inv, KeyStatus.DENIED)


def _expired(state: DeciderState, e: ev.ApprovalExpired) -> DeciderState:
    """C11: a pending approval, or an unused artifact, ran out; the key it held too."""
    if e.stage == "granted":
        use = state.approvals.get(e.approval_jti)
        if use is None:
            return state
        state = _put_use(state, e.approval_jti, evolved(use, status=ApprovalStatus.EXPIRED))
        held = KeyStatus.APPROVED
        owner = state.invocations.get(use.invocation_id)
    else:
        held = KeyStatus.PENDING_APPROVAL
        owner = state.invocations.get(e.invocation_id)
    if owner is None:
        return state
    owner = evolved(owner, approval_status=ApprovalStatus.EXPIRED)
    state = _put(state, owner)
    rec = _key_of(state, owner)
    if rec is None or rec.status != held:
        return state
    return _with_key(state, owner, status=KeyStatus.EXPIRED)


def _usage_settled(state: DeciderState, e: ev.UsageCommitted | ev.UsageReleased) -> DeciderState:
    """ADR 0079: a held reservation given back, once."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    to = COMMITTED if isinstance(e, ev.UsageCommitted) else RELEASED
    usage = tuple(
        {**u, "state": to} if u["id"] == e.reservation_id and u["state"] == RESERVED else u
        for u in inv.usage
    )
    return state if usage == inv.usage else _put(state, evolved(inv, usage=usage))


# -- inputs that change state by themselves ----------------------------------------------


def _decision_seen(state: DeciderState, e: ev.ApprovalDecisionSubmitted) -> DeciderState:
    if e.event_id in state.decisions_seen:
        return state
    seen = (*state.decisions_seen, e.event_id)
    return DeciderState(state.invocations, state.keys, state.approvals, seen)


def _started(state: DeciderState, e: ev.ExecutionStarted) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None or inv.started_attempt >= e.attempt:
        return state
    return _put(state, evolved(inv, started_attempt=e.attempt))


def _dry_run_recorded(state: DeciderState, e: ev.DryRunRecorded) -> DeciderState:
    """The snapshot the execution follows (C5); one a human is asked to confirm is kept by
    its ``ApprovalRequested``."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None or inv.phase not in (Phase.CONFIRMING, Phase.DRY_RUN_THEN_EXECUTE):
        return state
    return _put(state, evolved(inv, dry_run_json=e.snapshot_json, dry_run_hash=e.snapshot_hash))


def _settled(state: DeciderState, invocation_id: str, outcome: str, result: str) -> DeciderState:
    """C8: the outcome is stored on the call and on its key (its waiters are replayed)."""
    inv = state.invocations.get(invocation_id)
    if inv is None or (inv.phase == Phase.SETTLED and inv.outcome != Code.OUTCOME_UNCERTAIN):
        return state
    inv = evolved(inv, phase=Phase.SETTLED, outcome=outcome, result_json=result)
    state = _put(state, inv)
    rec = _key_of(state, inv)
    if rec is None or rec.invocation_id != invocation_id:
        return state
    return _with_key(state, inv, status=KeyStatus.DONE, outcome=outcome, result_json=result)


def _succeeded(state: DeciderState, e: ev.ExecutionSucceeded) -> DeciderState:
    return _settled(state, e.invocation_id, Code.EXECUTED.value, e.result_json)


def _failed(state: DeciderState, e: ev.ExecutionFailed) -> DeciderState:
    message = canonical_json({"error": e.message})
    return _settled(state, e.invocation_id, failure_code(e.code).value, message)


def _uncertain(state: DeciderState, e: ev.ExecutionUncertain) -> DeciderState:
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
    state = _put(state, inv)
    rec = _key_of(state, inv)
    if rec is None or rec.invocation_id != inv.invocation_id:
        return state
    return _with_key(state, inv, status=KeyStatus.UNCERTAIN)


def _lookup_failed(
    state: DeciderState, waiter: Invocation, e: ev.ExecutionUncertain
) -> DeciderState:
    """C12: a retry's reconciliation could not learn what became of the original call: the
    retry is ``outcome_uncertain``; the key stays uncertain when no one else waits (the
    next waiter, if any, asks again: ``key_records.on_lookup_failed``)."""
    rec = _key_of(state, waiter)
    if (
        rec is None
        or rec.status != KeyStatus.RECONCILING
        or rec.execution_token != e.execution_token
        or waiter.invocation_id not in rec.waiters
    ):
        return state
    waiter = evolved(waiter, phase=Phase.SETTLED, outcome=Code.OUTCOME_UNCERTAIN.value)
    state = _without_waiter(_put(state, waiter), waiter)
    rec = _key_of(state, waiter)
    if rec is None or any(w in state.invocations for w in rec.waiters):
        return state
    return _with_key(state, waiter, status=KeyStatus.UNCERTAIN)


def _reconciled(state: DeciderState, e: ev.ExecutionReconciled) -> DeciderState:
    """C12: what the provider said happened, recorded once per reconciliation."""
    original_id = e.original_invocation_id or e.invocation_id
    original = state.invocations.get(original_id)
    if original is None or e.event_id in original.reconciliations:
        return state
    original = evolved(original, reconciliations=(*original.reconciliations, e.event_id))
    state = _put(state, original)
    if not e.found:
        return state
    original = evolved(
        original, phase=Phase.SETTLED, outcome=Code.EXECUTED.value, result_json=e.result_json
    )
    state = _put(state, original)
    rec = _key_of(state, original)
    if rec is None or rec.invocation_id != original_id:
        return state
    return _with_key(
        state,
        original,
        status=KeyStatus.DONE,
        outcome=Code.EXECUTED.value,
        result_json=e.result_json,
    )


def _usage_answered(state: DeciderState, e: ev.UsageReserved | ev.UsageRefused) -> DeciderState:
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
    return _put(state, evolved(inv, usage=tuple(usage))) if changed else state


def _fold(
    fn: Callable[[DeciderState, E], DeciderState],
) -> Callable[[DeciderState, ev.Event], DeciderState]:
    return fn  # type: ignore[return-value]  # dispatched by the event's exact type below


_FOLDS: dict[type[ev.Event], Callable[[DeciderState, ev.Event], DeciderState]] = {
    ev.ProposalRejected: _fold(_rejected),
    ev.PolicyDecided: _fold(_decided),
    ev.ResourceDescriptionRequested: _fold(_describing),
    ev.UsageReserveRequested: _fold(_reserving),
    ev.ConfirmationAccepted: _fold(_confirmed),
    ev.DryRunRequested: _fold(_dry_run_requested),
    ev.ApprovalRequested: _fold(_approval_requested),
    ev.ExecutionRequested: _fold(_execution_requested),
    ev.ReplayServed: _fold(_replayed),
    ev.ReplayAwaited: _fold(_awaiting),
    ev.ReconciliationRequested: _fold(_reconciling),
    ev.ApprovalGrantRecorded: _fold(_grant_recorded),
    ev.ApprovalGranted: _fold(_granted),
    ev.ApprovalDenied: _fold(_denied),
    ev.ApprovalExpired: _fold(_expired),
    ev.UsageCommitted: _fold(_usage_settled),
    ev.UsageReleased: _fold(_usage_settled),
    ev.ApprovalDecisionSubmitted: _fold(_decision_seen),
    ev.ExecutionStarted: _fold(_started),
    ev.DryRunRecorded: _fold(_dry_run_recorded),
    ev.ExecutionSucceeded: _fold(_succeeded),
    ev.ExecutionFailed: _fold(_failed),
    ev.ExecutionUncertain: _fold(_uncertain),
    ev.ExecutionReconciled: _fold(_reconciled),
    ev.UsageReserved: _fold(_usage_answered),
    ev.UsageRefused: _fold(_usage_answered),
}

__all__ = ["ASKED", "COMMITTED", "REFUSED", "RELEASED", "RESERVED", "evolve"]
