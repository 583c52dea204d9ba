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
from callgate.decider.limits import usage_shown
from callgate.decider.state import ApprovalStatus, Invocation, Phase, key_record
from callgate.domain import events as ev
from callgate.domain.approvals import ApprovalClaims, require_match
from callgate.domain.canonical import canonical_json, execution_token
from callgate.domain.catalog import Confirmation, ToolSpec
from callgate.domain.codes import Code, Rejection


def authorize(
    inv: Invocation,
    spec: ToolSpec,
    claims: ApprovalClaims | None,
    out: Emitter,
    confirmation: str | None = None,
) -> None:
    """The call passed every check: dry-run, ask for approval, or execute (C2-C5); its
    idempotency key now names it (``evolve``). ``confirmation``: the one it needs when
    not its own (a limit an approver may lift, ADR 0079)."""
    if claims is not None:
        # C5/C11: confirm against what the human saw: re-run the dry-run and compare.
        approved = claims.binding.dry_run_hash
        inv = _confirmation_accepted(inv, claims, claims.binding.invocation_id, out)
        if spec.require_dry_run:
            _request_dry_run(inv, out, approval_jti=claims.jti, approved_dry_run_hash=approved)
        elif approved != no_dry_run_hash(inv):
            reject_late(inv, mismatch(["dry_run_hash"]), out)
        else:
            request_execution(inv, out)
        return
    needed = confirmation or inv.confirmation
    if Confirmation(needed) is not Confirmation.NONE:
        if spec.require_dry_run:
            _request_dry_run(inv, out, confirmation=needed)
        else:
            request_approval(inv, "{}", no_dry_run_hash(inv), out, confirmation=needed)
        return
    if spec.require_dry_run:
        _request_dry_run(inv, out, confirmation=Confirmation.NONE.value)
        return
    request_execution(inv, out)


def continue_approved(inv: Invocation, claims: ApprovalClaims, out: Emitter) -> None:
    """ADR 0029: the invocation that asked for ``claims`` runs exactly the approved call.

    The same path as a resubmission presenting the artifact (C5, C11): the approval is
    consumed by this invocation (single use), the dry-run runs again and must hash to
    what the approver saw, then the execution is requested. Only a granted, unexpired
    approval gets here; denied and expired ones never continue.
    """
    if not inv.continue_on_approval or inv.phase != Phase.PENDING_APPROVAL:
        return  # the agent resubmits with the approval_id (C4)
    if out.state.approvals[claims.jti].consumed_by:
        return
    approved = claims.binding.dry_run_hash
    inv = _confirmation_accepted(inv, claims, inv.invocation_id, out)
    if inv.require_dry_run:
        _request_dry_run(inv, out, approval_jti=claims.jti, approved_dry_run_hash=approved)
    else:
        request_execution(inv, out)


def _confirmation_accepted(
    inv: Invocation, claims: ApprovalClaims, approved_invocation_id: str, out: Emitter
) -> Invocation:
    """C5, C11: ``inv`` uses the approval ``claims`` (single use, folded by ``evolve``);
    ``inv`` as it is after that."""
    out.emit(
        ev.ConfirmationAccepted,
        approval_jti=claims.jti,
        approved_invocation_id=approved_invocation_id,
        approver=claims.approver,
        dry_run_hash=claims.binding.dry_run_hash,
    )
    return out.state.invocations[inv.invocation_id]


def confirm_evaluation(
    deps: DeciderDeps,
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
    use = out.state.approvals.get(claims.jti)
    owner = out.state.invocations.get(presented.invocation_id)
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
    if spec.require_dry_run:
        # The approval is used from here (``evolve``); ``on_dry_run`` compares, then
        # ``accept_evaluation``.
        _request_dry_run(
            inv, out, approval_jti=claims.jti, approved_dry_run_hash=presented.dry_run_hash
        )
    elif presented.dry_run_hash != no_dry_run_hash(inv):
        reject_late(inv, mismatch(["dry_run_hash"]), out)
    else:
        accept_evaluation(inv, claims.jti, presented.dry_run_hash, out)


def accept_evaluation(inv: Invocation, jti: str, approved: str, out: Emitter) -> None:
    """ADR 0090: the approval ``jti`` the evaluation presented holds: it is ``permitted``
    and the approval used."""
    use = out.state.approvals[jti]
    out.emit(
        ev.ConfirmationAccepted,
        invocation_id=inv.invocation_id,
        approval_jti=jti,
        approved_invocation_id=use.invocation_id,
        approver=use.approver,
        evaluate_only=True,
        dry_run_hash=approved,
    )


def _request_dry_run(
    inv: Invocation,
    out: Emitter,
    *,
    confirmation: str | None = None,
    approval_jti: str = "",
    approved_dry_run_hash: str = "",
) -> None:
    """The phase follows from the event (``evolve``): confirming ``approval_jti``, else
    before asking for ``confirmation``, else (``none``) before the execution."""
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
        confirmation=confirmation or inv.confirmation,
        approval_jti=approval_jti,
        approved_dry_run_hash=approved_dry_run_hash,
    )


def request_approval(
    inv: Invocation,
    snapshot_json: str,
    snapshot_hash: str,
    out: Emitter,
    confirmation: str | None = None,
) -> None:
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
        confirmation=confirmation or inv.confirmation,
        approver_roles=tuple(inv.approver_roles),
        expires_at=out.now_ms + inv.approval_ttl_ms,
        allow_self_approval=inv.allow_self_approval,
        approvals_required=inv.approvals_required,
        usage_json=usage_shown(inv) if any(u["over_limit"] for u in inv.usage) else "",
    )


def request_execution(inv: Invocation, out: Emitter, attempt: int | None = None) -> None:
    """Execute ``inv`` (``attempt``: the next of its own unless it retries another's)."""
    pk = out.cause.partition_key
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
        execution_token=execution_token(
            pk, inv.fingerprint, inv.invocation_id, inv.idempotency_key
        ),
        attempt=inv.attempt + 1 if attempt is None else attempt,
        policy_version=inv.policy_version,
    )


def reject_late(inv: Invocation, r: Rejection, out: Emitter) -> None:
    """A rejection after authorization began: what the invocation held is released as its
    ``ProposalRejected`` is folded (the approval it used, its idempotency key); the calls
    waiting on its key fail with it when nothing was authorized under the key, or when a
    confirmation failed."""
    rec = key_record(out.state, inv)
    waiters: tuple[str, ...] = ()
    if rec is not None and (rec.invocation_id == inv.invocation_id or inv.approval_jti):
        waiters = rec.waiters
    for waiter in waiters:
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
