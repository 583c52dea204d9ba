"""After every check passed: dry-run, ask for approval, or execute (C2, C3, C4, C5, C11).

Reads run after the ACL check alone (C2); a confirmation policy other than ``none``
asks a human to confirm the dry-run (C5) or, for tools without one, the arguments;
a presented approval is confirmed against a fresh dry-run before execution (C5, C11).
``reject_late`` settles a call that fails after authorization began and releases the
approval and idempotency key it held (C8).
"""

from __future__ import annotations

from callgate.decider.approvals import binding_of, mismatch, no_dry_run_hash, presented_approval
from callgate.decider.deps import DeciderDeps
from callgate.decider.emitter import Emitter
from callgate.decider.key_records import key_record, set_key_status
from callgate.decider.limits import usage_shown
from callgate.decider.state import (
    ApprovalStatus,
    DeciderState,
    Invocation,
    KeyRecord,
    KeyStatus,
    Phase,
)
from callgate.domain import events as ev
from callgate.domain.approvals import ApprovalClaims, require_match
from callgate.domain.canonical import canonical_json, execution_token
from callgate.domain.catalog import Confirmation, ToolSpec
from callgate.domain.codes import Code, Rejection


def authorize(
    state: DeciderState,
    inv: Invocation,
    spec: ToolSpec,
    claims: ApprovalClaims | None,
    out: Emitter,
) -> None:
    """The call passed every check: dry-run, ask for approval, or execute (C2-C5)."""
    if inv.idempotency_key is not None and inv.idempotency_key not in state.keys:
        state.keys[inv.idempotency_key] = KeyRecord(
            actor=inv.actor,
            tool=inv.tool,
            target=inv.target,
            fingerprint=inv.fingerprint,
            invocation_id=inv.invocation_id,
            status=KeyStatus.EXECUTING,
        )
    if claims is not None:
        # C5/C11: confirm against what the human saw: re-run the dry-run and compare.
        out.emit(
            ev.ConfirmationAccepted,
            approval_jti=claims.jti,
            approved_invocation_id=claims.binding.invocation_id,
            approver=claims.approver,
        )
        use = state.approvals[claims.jti]
        use.consumed_by, use.consumer_key = inv.invocation_id, inv.idempotency_key
        if spec.require_dry_run:
            inv.phase = Phase.CONFIRMING
            _request_dry_run(inv, out)
        elif claims.binding.dry_run_hash != no_dry_run_hash(inv):
            reject_late(state, inv, mismatch(["dry_run_hash"]), out)
        else:
            request_execution(state, inv, out)
        return
    if Confirmation(inv.confirmation) is not Confirmation.NONE:
        inv.phase = Phase.AWAITING_DRY_RUN
        set_key_status(state, inv, KeyStatus.PENDING_APPROVAL)
        if spec.require_dry_run:
            _request_dry_run(inv, out)
        else:
            request_approval(state, inv, "{}", no_dry_run_hash(inv), out)
        return
    if spec.require_dry_run:
        inv.phase = Phase.DRY_RUN_THEN_EXECUTE
        _request_dry_run(inv, out)
        return
    request_execution(state, inv, out)


def continue_approved(
    state: DeciderState, inv: Invocation, claims: ApprovalClaims, out: Emitter
) -> None:
    """ADR 0029: the invocation that asked for ``claims`` runs exactly the approved call.

    The same path as a resubmission presenting the artifact (C5, C11): the approval is
    consumed by this invocation (single use), the dry-run runs again and must hash to
    what the approver saw, then the execution is requested. Only a granted, unexpired
    approval gets here; denied and expired ones never continue.
    """
    if not inv.continue_on_approval or inv.phase != Phase.PENDING_APPROVAL:
        return  # the agent resubmits with the approval_id (C4)
    use = state.approvals[claims.jti]
    if use.consumed_by:
        return
    inv.approval_jti = claims.jti
    inv.approved_dry_run_hash = claims.binding.dry_run_hash
    use.consumed_by, use.consumer_key = inv.invocation_id, inv.idempotency_key
    out.emit(
        ev.ConfirmationAccepted,
        approval_jti=claims.jti,
        approved_invocation_id=inv.invocation_id,
        approver=claims.approver,
    )
    if inv.require_dry_run:
        inv.phase = Phase.CONFIRMING
        _request_dry_run(inv, out)
    else:
        request_execution(state, inv, out)


def confirm_evaluation(
    deps: DeciderDeps,
    state: DeciderState,
    inv: Invocation,
    spec: ToolSpec,
    p: ev.ToolCallProposed,
    out: Emitter,
) -> None:
    """ADR 0090: a re-evaluation presents the approval of an access request. It is checked
    as a call's (C4, C5, C11): genuine and unexpired, bound to this exact call (tenant,
    actor, tool, target, policy version, arguments), granted for an access request, unused,
    and confirmed against a fresh dry-run when the tool has one. Then the evaluation is
    ``permitted`` and the approval used: one approval, one permit. Nothing runs."""
    claims = presented_approval(deps, p, out.now_ms)  # approval_missing / approval_expired
    if claims is None:
        return
    presented = claims.binding
    expected = binding_of(inv, presented.dry_run_hash, p.partition_key, presented.invocation_id)
    require_match(expected, presented)  # approval_mismatch naming the bindings
    use = state.approvals.get(claims.jti)
    owner = state.invocations.get(presented.invocation_id)
    if use is None or owner is None or presented.partition_key != p.partition_key:
        raise Rejection(Code.APPROVAL_MISSING, f"approval {claims.jti} is not known here")
    if not owner.access_request:
        # A call's approval continues or confirms that call; it permits no evaluation.
        raise Rejection(
            Code.APPROVAL_MISMATCH,
            f"approval {claims.jti} was granted for a call, not for an access request",
            {"bindings": "access_request"},
        )
    if use.status == ApprovalStatus.EXPIRED:
        raise Rejection(Code.APPROVAL_EXPIRED, f"approval {claims.jti} expired")
    if use.consumed_by:
        raise Rejection(
            Code.APPROVAL_CONSUMED,
            f"approval {claims.jti} was already used by invocation {use.consumed_by}",
            {"used_by": use.consumed_by},
        )
    use.consumed_by, use.consumer_key = inv.invocation_id, None
    inv.approval_jti = claims.jti
    inv.approved_dry_run_hash = presented.dry_run_hash
    if spec.require_dry_run:
        inv.phase = Phase.CONFIRMING  # ``on_dry_run`` compares, then ``accept_evaluation``
        _request_dry_run(inv, out)
    elif presented.dry_run_hash != no_dry_run_hash(inv):
        reject_late(state, inv, mismatch(["dry_run_hash"]), out)
    else:
        accept_evaluation(state, inv, out)


def accept_evaluation(state: DeciderState, inv: Invocation, out: Emitter) -> None:
    """ADR 0090: the approval the evaluation presented holds: it is ``permitted``."""
    use = state.approvals[inv.approval_jti]
    inv.phase, inv.outcome = Phase.SETTLED, Code.PERMITTED.value
    out.emit(
        ev.ConfirmationAccepted,
        approval_jti=inv.approval_jti,
        approved_invocation_id=use.invocation_id,
        approver=use.approver,
        evaluate_only=True,
    )


def _request_dry_run(inv: Invocation, out: Emitter) -> None:
    out.emit(
        ev.DryRunRequested,
        invocation_id=inv.invocation_id,
        tenant=inv.tenant,
        actor=inv.actor,
        agent=inv.agent,
        delegation=tuple(inv.delegation),
        tool=inv.tool,
        target=inv.target,
        args_json=inv.args_json,
        policy_version=inv.policy_version,
    )


def request_approval(
    state: DeciderState, inv: Invocation, snapshot_json: str, snapshot_hash: str, out: Emitter
) -> None:
    inv.phase, inv.outcome = Phase.PENDING_APPROVAL, Code.APPROVAL_REQUIRED.value
    inv.dry_run_json, inv.dry_run_hash = snapshot_json, snapshot_hash
    inv.approval_status = ApprovalStatus.PENDING
    inv.approval_expires_at = out.now_ms + inv.approval_ttl_ms
    set_key_status(state, inv, KeyStatus.PENDING_APPROVAL)
    out.emit(
        ev.ApprovalRequested,
        invocation_id=inv.invocation_id,
        tenant=inv.tenant,
        actor=inv.actor,
        agent=inv.agent,
        delegation=tuple(inv.delegation),
        tool=inv.tool,
        target=inv.target,
        args_json=inv.args_json,
        args_hash=inv.args_hash,
        dry_run_json=snapshot_json,
        dry_run_hash=snapshot_hash,
        policy_version=inv.policy_version,
        confirmation=inv.confirmation,
        approver_roles=tuple(inv.approver_roles),
        expires_at=inv.approval_expires_at,
        allow_self_approval=inv.allow_self_approval,
        approvals_required=inv.approvals_required,
        usage_json=usage_shown(inv) if any(u["over_limit"] for u in inv.usage) else "",
    )


def request_execution(state: DeciderState, inv: Invocation, out: Emitter) -> None:
    pk = out.cause.partition_key
    inv.phase, inv.outcome = Phase.EXECUTING, Code.ALLOWED.value
    inv.execution_token = execution_token(
        pk, inv.fingerprint, inv.invocation_id, inv.idempotency_key
    )
    inv.attempt += 1
    rec = key_record(state, inv)
    if rec is not None:
        rec.status, rec.execution_token, rec.invocation_id = (
            KeyStatus.EXECUTING,
            inv.execution_token,
            inv.invocation_id,
        )
    out.emit(
        ev.ExecutionRequested,
        invocation_id=inv.invocation_id,
        tenant=inv.tenant,
        actor=inv.actor,
        agent=inv.agent,
        delegation=tuple(inv.delegation),
        tool=inv.tool,
        target=inv.target,
        args_json=inv.args_json,
        execution_token=inv.execution_token,
        attempt=inv.attempt,
        policy_version=inv.policy_version,
    )


def reject_late(state: DeciderState, inv: Invocation, r: Rejection, out: Emitter) -> None:
    """A rejection after authorization began: release what the invocation held."""
    inv.phase, inv.outcome = Phase.SETTLED, r.code.value
    if inv.approval_jti and inv.approval_jti in state.approvals:
        use = state.approvals[inv.approval_jti]
        if use.consumed_by == inv.invocation_id:
            use.consumed_by, use.consumer_key = "", None
    rec = key_record(state, inv)
    waiters: list[str] = []
    if rec is not None and rec.invocation_id == inv.invocation_id:
        # Nothing was authorized under this key: free it so a corrected call can use it.
        waiters = rec.waiters
        del state.keys[inv.idempotency_key or ""]
    elif rec is not None and inv.approval_jti:
        # A confirmation failed: the same-key calls waiting on it fail with it.
        waiters, rec.waiters = rec.waiters, []
    for waiter in waiters:
        w = state.invocations.get(waiter)
        if w is not None:
            w.phase, w.outcome = Phase.SETTLED, r.code.value
        out.emit(
            ev.ProposalRejected,
            invocation_id=waiter,
            code=r.code.value,
            message=f"the original call {inv.invocation_id} failed: {r.message}",
            tool=inv.tool,
            actor=inv.actor,
            tenant=inv.tenant,
            details_json=canonical_json({**r.details, "original_invocation_id": inv.invocation_id}),
            agent=inv.agent,
            delegation=tuple(inv.delegation),
        )
    out.emit(
        ev.ProposalRejected,
        invocation_id=inv.invocation_id,
        code=r.code.value,
        message=r.message,
        tool=inv.tool,
        actor=inv.actor,
        tenant=inv.tenant,
        details_json=canonical_json(r.details),
        agent=inv.agent,
        delegation=tuple(inv.delegation),
    )


__all__ = [
    "accept_evaluation",
    "authorize",
    "confirm_evaluation",
    "continue_approved",
    "reject_late",
    "request_approval",
    "request_execution",
]
