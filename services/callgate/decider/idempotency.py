"""A proposal under an idempotency key already known on this partition (C8, C12).

C8: a key is replay protection only. It replays the original authorized call's result
when actor, tool, target and request fingerprint all match, and is otherwise
``idempotency_conflict``; it never authorizes a first call by itself. C12: after an
uncertain outcome the original operation is reconciled with the provider before any
retry under the same key.
"""

from __future__ import annotations

from callgate.decider.authorization import authorize
from callgate.decider.deps import DeciderDeps
from callgate.decider.emitter import Emitter
from callgate.decider.key_records import request_reconciliation
from callgate.decider.state import Invocation, KeyRecord, KeyStatus, key_record
from callgate.domain import events as ev
from callgate.domain.approvals import ApprovalClaims
from callgate.domain.codes import Code, Rejection


def on_known_key(
    deps: DeciderDeps,
    inv: Invocation,
    rec: KeyRecord,
    claims: ApprovalClaims | None,
    out: Emitter,
) -> None:
    """C8: a key replays the original authorized call; it never authorizes by itself."""
    differing = [
        name
        for name, a, b in (
            ("actor", rec.actor, inv.actor),
            ("tool", rec.tool, inv.tool),
            ("target", rec.target, inv.target),
            ("fingerprint", rec.fingerprint, inv.fingerprint),
        )
        if a != b
    ]
    if differing:
        raise Rejection(
            Code.IDEMPOTENCY_CONFLICT,
            f"idempotency key reused with a different {', '.join(differing)}",
            {"differs": ",".join(differing), "original_invocation_id": rec.invocation_id},
        )
    if rec.status == KeyStatus.DONE:
        out.emit(
            ev.ReplayServed,
            original_invocation_id=rec.invocation_id,
            original_outcome=rec.outcome,
            result_json=rec.result_json,
        )
    elif rec.status == KeyStatus.DENIED:
        raise Rejection(
            Code.APPROVAL_DENIED,
            f"the approval for invocation {rec.invocation_id} was denied",
            {"original_invocation_id": rec.invocation_id},
        )
    elif rec.status in (KeyStatus.PENDING_APPROVAL, KeyStatus.APPROVED):
        if claims is None:
            raise Rejection(
                Code.APPROVAL_REQUIRED,
                f"awaiting approval of invocation {rec.invocation_id}; "
                "resubmit with its approval_id",
                {"pending_invocation_id": rec.invocation_id},
            )
        use = out.state.approvals[claims.jti]
        if use.consumed_by and use.consumed_by != inv.invocation_id:
            # C8: the same key and approval are being confirmed by another invocation
            # right now; wait for it and replay its outcome, never confirm twice.
            out.emit(ev.ReplayAwaited, original_invocation_id=rec.invocation_id)
            return
        spec = deps.profile.tool(inv.tool)
        assert spec is not None  # checked before policy
        authorize(inv, spec, claims, out)
    elif rec.status == KeyStatus.EXPIRED:
        # The expired approval's call gives the key up: this call's authorization takes it.
        spec = deps.profile.tool(inv.tool)
        assert spec is not None
        authorize(inv, spec, claims, out)
    elif rec.status == KeyStatus.UNCERTAIN:
        # C12: reconcile the original operation before anything else.
        out.emit(ev.ReplayAwaited, original_invocation_id=rec.invocation_id)
        waiting = out.state.invocations[inv.invocation_id]
        request_reconciliation(key_record(out.state, waiting) or rec, waiting, out)
    else:  # executing or reconciling: wait for the original to settle, then replay it
        out.emit(ev.ReplayAwaited, original_invocation_id=rec.invocation_id)


__all__ = ["on_known_key"]
