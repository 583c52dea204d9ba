"""How each event the decider emits changes its state (``evolve``, ADR 0092)."""

from __future__ import annotations

from typing import Any

from callgate.decider.copy_on_write import (
    authorized,
    consume,
    put,
    put_key,
    put_use,
    with_key,
    with_own_key,
    without_waiter,
)
from callgate.decider.state import (
    ASKED,
    COMMITTED,
    RELEASED,
    RESERVED,
    ApprovalStatus,
    ApprovalUse,
    DeciderState,
    Invocation,
    KeyStatus,
    Phase,
    evolved,
    key_record,
)
from callgate.domain import events as ev
from callgate.domain.codes import Code, evaluation_outcome


def rejected(state: DeciderState, e: ev.ProposalRejected) -> DeciderState:
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
        return put(state, fresh)
    inv = evolved(inv, phase=Phase.SETTLED, outcome=e.code)
    state = put(state, inv)
    use = state.approvals.get(inv.approval_jti) if inv.approval_jti else None
    if use is not None and use.consumed_by == inv.invocation_id:
        state = put_use(state, inv.approval_jti, evolved(use, consumed_by="", consumer_key=None))
    rec = key_record(state, inv)
    if rec is not None and inv.invocation_id in rec.waiters:
        return without_waiter(state, inv)
    if rec is not None and rec.invocation_id == inv.invocation_id:
        return put_key(state, inv.idempotency_key or "", None)
    return state


def decided(state: DeciderState, e: ev.PolicyDecided) -> DeciderState:
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
    return put(state, inv)


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


def describing(state: DeciderState, e: ev.ResourceDescriptionRequested) -> DeciderState:
    """C7: parked until the provider says who owns the target."""
    return put(state, _parked(e, Phase.DESCRIBING, e.partition_key, e.causation_id))


def reserving(state: DeciderState, e: ev.UsageReserveRequested) -> DeciderState:
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
        return put(state, evolved(inv, usage=(*inv.usage, entry)))
    # A described proposal keeps the id of the proposal it was described for.
    proposal = e.causation_id if inv is None else inv.proposal_event_id
    parked = _parked(
        e, Phase.RESERVING, e.reply_key, proposal, facts_json=e.facts_json, usage=(entry,)
    )
    return put(state, parked)


def confirmed(state: DeciderState, e: ev.ConfirmationAccepted) -> DeciderState:
    """C5, C11: the approval is used by this call; an evaluation it confirms is permitted
    (ADR 0090); a same-key retry that completes another's confirmed call names it (C9)."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    if inv.phase == Phase.WAITING:  # a retry taking over the original's call
        return put(state, evolved(inv, approval_jti=e.approval_jti))
    state = authorized(state, inv)
    inv = evolved(inv, approval_jti=e.approval_jti, approved_dry_run_hash=e.dry_run_hash)
    if e.evaluate_only:
        inv = evolved(inv, phase=Phase.SETTLED, outcome=Code.PERMITTED.value)
    return consume(put(state, inv), e.approval_jti, inv)


def dry_run_requested(state: DeciderState, e: ev.DryRunRequested) -> DeciderState:
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
        return consume(put(authorized(state, inv), inv), e.approval_jti, inv)
    if e.confirmation and e.confirmation != "none":
        inv = evolved(inv, phase=Phase.AWAITING_DRY_RUN, confirmation=e.confirmation)
        state = put(authorized(state, inv), inv)
        return with_own_key(state, inv, status=KeyStatus.PENDING_APPROVAL)
    inv = evolved(inv, phase=Phase.DRY_RUN_THEN_EXECUTE)
    return put(authorized(state, inv), inv)


def approval_requested(state: DeciderState, e: ev.ApprovalRequested) -> DeciderState:
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
    state = put(authorized(state, inv), inv)
    return with_own_key(state, inv, status=KeyStatus.PENDING_APPROVAL)


def execution_requested(state: DeciderState, e: ev.ExecutionRequested) -> DeciderState:
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
    rec = authorized(state, inv).keys[key]
    rec = evolved(
        rec,
        status=KeyStatus.EXECUTING,
        execution_token=e.execution_token,
        invocation_id=inv.invocation_id,
        waiters=tuple(w for w in rec.waiters if w != inv.invocation_id),
    )
    keys = {**state.keys, key: rec}
    return DeciderState(invocations, keys, state.approvals, state.decisions_seen)


def replayed(state: DeciderState, e: ev.ReplayServed) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    inv = evolved(inv, phase=Phase.SETTLED, outcome=Code.REPLAYED.value)
    return without_waiter(put(state, inv), inv)


def awaiting(state: DeciderState, e: ev.ReplayAwaited) -> DeciderState:
    """C8: the call waits on its key's original, to be replayed (or to fail) with it."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    inv = evolved(inv, phase=Phase.WAITING, outcome=Code.ALLOWED.value)
    state = put(state, inv)
    rec = key_record(state, inv)
    if rec is None or inv.invocation_id in rec.waiters:
        return state
    return with_key(state, inv, waiters=(*rec.waiters, inv.invocation_id))


def reconciling(state: DeciderState, e: ev.ReconciliationRequested) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    return with_key(state, inv, status=KeyStatus.RECONCILING)


def grant_recorded(state: DeciderState, e: ev.ApprovalGrantRecorded) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    return put(state, evolved(inv, grants=(*inv.grants, e.approver)))


def granted(state: DeciderState, e: ev.ApprovalGranted) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    inv = evolved(inv, approval_status=ApprovalStatus.GRANTED)
    use = ApprovalUse(inv.invocation_id, ApprovalStatus.GRANTED, e.expires_at, approver=e.approver)
    state = put_use(put(state, inv), e.approval_jti, use)
    return with_own_key(state, inv, status=KeyStatus.APPROVED)


def denied(state: DeciderState, e: ev.ApprovalDenied) -> DeciderState:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    inv = evolved(inv, approval_status=ApprovalStatus.DENIED)
    return with_own_key(put(state, inv), inv, status=KeyStatus.DENIED)


def expired(state: DeciderState, e: ev.ApprovalExpired) -> DeciderState:
    """C11: a pending approval, or an unused artifact, ran out; the key it held too."""
    if e.stage == "granted":
        use = state.approvals.get(e.approval_jti)
        if use is None:
            return state
        state = put_use(state, e.approval_jti, evolved(use, status=ApprovalStatus.EXPIRED))
        held = KeyStatus.APPROVED
        owner = state.invocations.get(use.invocation_id)
    else:
        held = KeyStatus.PENDING_APPROVAL
        owner = state.invocations.get(e.invocation_id)
    if owner is None:
        return state
    owner = evolved(owner, approval_status=ApprovalStatus.EXPIRED)
    state = put(state, owner)
    rec = key_record(state, owner)
    if rec is None or rec.status != held:
        return state
    return with_key(state, owner, status=KeyStatus.EXPIRED)


def usage_settled(state: DeciderState, e: ev.UsageCommitted | ev.UsageReleased) -> DeciderState:
    """ADR 0079: a held reservation given back, once."""
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return state
    to = COMMITTED if isinstance(e, ev.UsageCommitted) else RELEASED
    usage = tuple(
        {**u, "state": to} if u["id"] == e.reservation_id and u["state"] == RESERVED else u
        for u in inv.usage
    )
    return state if usage == inv.usage else put(state, evolved(inv, usage=usage))


__all__ = [
    "approval_requested",
    "awaiting",
    "confirmed",
    "decided",
    "denied",
    "describing",
    "dry_run_requested",
    "execution_requested",
    "expired",
    "grant_recorded",
    "granted",
    "reconciling",
    "rejected",
    "replayed",
    "reserving",
    "usage_settled",
]
