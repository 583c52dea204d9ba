"""Approvals in the decider: presented artifacts, human decisions, bindings (C4, C5, C11).

An approval binds actor, tool, target, policy version, normalized arguments and the
dry-run snapshot hash (C4, C11), so swapping an argument cannot reuse it (V2:
``approval_mismatch`` naming the differing bindings). A presented approval is checked
after policy and before idempotency, in the contract's order (docs/contract.md):
``approval_expired``,
``approval_mismatch``, ``approval_denied``, ``approval_consumed``; a replay of the very
call it authorized gets the stored result.
"""

from __future__ import annotations

from callgate.decider.deps import DeciderDeps
from callgate.decider.emitter import Emitter
from callgate.decider.state import ApprovalStatus, Invocation, Phase
from callgate.domain import events as ev
from callgate.domain.approvals import (
    ApprovalBinding,
    ApprovalClaims,
    approval_jti,
    check_approver,
    require_match,
)
from callgate.domain.codes import Code, Rejection, Unanswerable
from callgate.domain.identity import token_digest
from callgate.domain.principal import looks_alike
from callgate.domain.scope import is_bound

_REPLAYABLE = frozenset(
    {Code.EXECUTED.value, Code.EXECUTION_FAILED.value, Code.TOKEN_EXCHANGE_FAILED.value}
)


def presented_approval(
    deps: DeciderDeps, p: ev.ToolCallProposed, now: int
) -> ApprovalClaims | None:
    if p.approval_id is None:
        return None
    return deps.approval_verifier.verify(p.approval_id, now)  # approval_missing/expired


def check_approval(
    inv: Invocation, claims: ApprovalClaims, p: ev.ToolCallProposed, out: Emitter
) -> bool:
    """C4, C11: the approval must be for this exact call, still usable, and unused.

    Returns True when the call was settled here (a replay of the call it authorized).
    """
    state = out.state
    presented = claims.binding
    expected = binding_of(inv, presented.dry_run_hash, p.partition_key, presented.invocation_id)
    require_match(expected, presented)  # approval_mismatch naming the bindings
    if presented.partition_key != p.partition_key:
        # Signed to another idempotency key's partition: only the invocation it was
        # granted for (resubmitted under that key) may use it, and single use is
        # tracked there. Anywhere else it is another invocation's approval.
        raise Rejection(
            Code.APPROVAL_CONSUMED,
            f"approval {claims.jti} belongs to invocation {presented.invocation_id} "
            "under another idempotency key; it cannot authorize this one",
            {"approved_invocation_id": presented.invocation_id},
        )
    use = state.approvals.get(claims.jti)
    if use is None:
        raise Rejection(Code.APPROVAL_MISSING, f"approval {claims.jti} is not known here")
    owner = state.invocations.get(presented.invocation_id)
    if owner is not None and owner.access_request:
        # ADR 0090: an access request's approval permits an evaluation, never a call here.
        raise Rejection(
            Code.APPROVAL_MISMATCH,
            f"approval {claims.jti} was granted for an access request, not for a call",
            {"bindings": "access_request"},
        )
    if use.status == ApprovalStatus.EXPIRED:
        raise Rejection(Code.APPROVAL_EXPIRED, f"approval {claims.jti} expired")
    if use.consumed_by:
        consumer = state.invocations.get(use.consumed_by)
        if (
            use.consumer_key is None
            and inv.idempotency_key is None
            and consumer is not None
            and consumer.phase == Phase.SETTLED
            and consumer.outcome in _REPLAYABLE
        ):
            # The very call it authorized, resubmitted: serve the stored result.
            out.emit(
                ev.ReplayServed,
                original_invocation_id=consumer.invocation_id,
                original_outcome=consumer.outcome,
                result_json=consumer.result_json,
            )
            return True
        if use.consumer_key is None or use.consumer_key != inv.idempotency_key:
            raise Rejection(
                Code.APPROVAL_CONSUMED,
                f"approval {claims.jti} was already used by invocation {use.consumed_by}",
                {"used_by": use.consumed_by},
            )
    return False  # the call's ``ConfirmationAccepted`` records the approval it uses


def on_approval_decision(
    deps: DeciderDeps, d: ev.ApprovalDecisionSubmitted, out: Emitter
) -> ApprovalClaims | None:
    """A human's decision on a pending approval; the artifact's claims when it was issued
    (the caller continues the invocation, ADR 0029), else None."""
    if not is_bound(d.event_id, d.session_token):
        # The decision's id keys its answer (the decisions view): only ids bound to the
        # deciding session are answered (docs/contract.md, "Tenant scope of identifiers").
        raise Unanswerable(
            Code.MALFORMED_EVENT,
            "the decision's event id is not bound to the session token (domain/scope.py)",
        )
    if d.event_id in out.before.decisions_seen:
        return None  # the same decision delivered twice: already answered
    digest = token_digest(d.session_token)  # recorded instead of the token (ADR 0016)
    try:
        approver = deps.sessions.verify(d.session_token, out.now_ms)
        inv = out.state.invocations.get(d.invocation_id)
        if inv is None or inv.approval_status != ApprovalStatus.PENDING:
            raise Rejection(
                Code.NOT_PENDING, f"invocation {d.invocation_id} has no pending approval"
            )
        if inv.approval_expires_at <= out.now_ms:
            raise Rejection(Code.APPROVAL_EXPIRED, "the pending approval has expired")
        if d.decision == ev.WITHDRAW:
            # ADR 0086: the actor withdraws their own pending call (MCP ``tasks/cancel``).
            # Only ever less runs, so no approver role is asked; anyone else is refused.
            if approver.tenant != inv.tenant or approver.user != inv.actor:
                raise Rejection(
                    Code.APPROVER_FORBIDDEN, "only the actor may withdraw their own call"
                )
        else:
            check_approver(
                inv.confirmation,
                approver,
                inv.actor,
                inv.tenant,
                tuple(inv.approver_roles),
                inv.allow_self_approval,
            )
        if d.decision not in ("grant", "deny", ev.WITHDRAW):
            raise Rejection(Code.MALFORMED_EVENT, f"unknown decision {d.decision!r}")
        if d.decision == "grant":
            already_granted(inv, approver.user)  # ADR 0030: distinct approvers
    except Rejection as r:
        out.emit(
            ev.ApprovalDecisionRejected,
            code=r.code.value,
            message=r.message,
            session_digest=digest,
        )
        return None
    if d.decision in ("deny", ev.WITHDRAW):  # a withdrawal is the actor's own denial
        out.emit(
            ev.ApprovalDenied,
            approver=approver.user,
            reason=d.reason,
            session_digest=digest,
            agent=approver.agent,
            delegation=approver.delegation,
        )
        return None
    if inv.approvals_required > 1:
        # ADR 0030: each grant is an event bound to what the invocation asks to confirm.
        out.emit(
            ev.ApprovalGrantRecorded,
            approver=approver.user,
            granted=len(inv.grants) + 1,
            required=inv.approvals_required,
            args_hash=inv.args_hash,
            dry_run_hash=inv.dry_run_hash,
            policy_version=inv.policy_version,
            session_digest=digest,
            agent=approver.agent,
            delegation=approver.delegation,
        )
        inv = out.state.invocations[d.invocation_id]
        if len(inv.grants) < inv.approvals_required:
            return None  # still pending: no artifact before the quorum
    jti = approval_jti(inv.invocation_id, approver.user, d.event_id)
    expires_at = out.now_ms + inv.approval_ttl_ms
    claims = ApprovalClaims(
        jti=jti,
        binding=binding_of(inv, inv.dry_run_hash, d.partition_key, inv.invocation_id),
        approver=approver.user,
        confirmation=inv.confirmation,
        issued_at=out.now_ms,
        expires_at=expires_at,
    )
    out.emit(
        ev.ApprovalGranted,
        approval_id=deps.approval_signer.sign(claims),
        approval_jti=jti,
        approver=approver.user,
        expires_at=expires_at,
        session_digest=digest,
        approvers=tuple(inv.grants),
        agent=approver.agent,
        delegation=approver.delegation,
    )
    return claims


def already_granted(inv: Invocation, approver: str) -> None:
    """ADR 0030: one grant per person; spellings are folded (``looks_alike``), so no one
    grants twice under two spellings. Folding only ever adds this refusal."""
    for earlier in inv.grants:
        if looks_alike(earlier, approver):
            raise Rejection(
                Code.APPROVER_FORBIDDEN,
                f"{approver} already granted this call; the quorum needs "
                f"{inv.approvals_required} distinct approvers",
                {"reason": "already_granted"},
            )


def binding_of(
    inv: Invocation, dry_run_hash: str, partition_key: str, invocation_id: str
) -> ApprovalBinding:
    """What an approval for ``inv`` binds (C4, C11): actor, tool, target, policy, arguments."""
    return ApprovalBinding(
        tenant=inv.tenant,
        actor=inv.actor,
        tool=inv.tool,
        target=inv.target,
        policy_version=inv.policy_version,
        args_hash=inv.args_hash,
        dry_run_hash=dry_run_hash,
        partition_key=partition_key,
        invocation_id=invocation_id,
    )


def mismatch(bindings: list[str]) -> Rejection:
    return Rejection(
        Code.APPROVAL_MISMATCH,
        f"approval does not match: {', '.join(bindings)}",
        {"bindings": ",".join(bindings)},
    )


def no_dry_run_hash(inv: Invocation) -> str:
    """Snapshot hash for tools without a dry-run: the human confirms the arguments."""
    return "args:" + inv.args_hash


__all__ = [
    "binding_of",
    "check_approval",
    "mismatch",
    "no_dry_run_hash",
    "on_approval_decision",
    "presented_approval",
]
