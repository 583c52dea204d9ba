"""What the executor reports back: dry-run results and execution outcomes (C5, C8, C9, C12).

A dry-run result is what the human confirms (C5); at confirmation it is compared with
the snapshot the approval hashed (C11, V2). A settled execution is stored on its
idempotency key and replayed to the calls waiting on it (C8). An uncertain outcome is
reconciled with the provider before any retry, and a retry executes at most once more
with the same execution token (C12).
"""

from __future__ import annotations

from callgate.decider.approvals import mismatch
from callgate.decider.authorization import (
    accept_evaluation,
    reject_late,
    request_approval,
    request_execution,
)
from callgate.decider.emitter import Emitter
from callgate.decider.key_records import (
    on_lookup_failed,
    request_reconciliation,
    serve_waiters,
)
from callgate.decider.state import KeyStatus, Phase, key_record
from callgate.domain import events as ev
from callgate.domain.codes import Rejection, failure_code


def on_dry_run(e: ev.DryRunRecorded, out: Emitter) -> None:
    """The snapshot came (kept on the call by ``evolve`` unless a human is asked about it)."""
    inv = out.state.invocations.get(e.invocation_id)
    if inv is None:
        return
    if inv.phase == Phase.AWAITING_DRY_RUN:
        request_approval(inv, e.snapshot_json, e.snapshot_hash, out)
    elif inv.phase == Phase.CONFIRMING:
        if e.snapshot_hash != inv.approved_dry_run_hash:
            # The world changed since the human confirmed: that approval no longer covers it.
            reject_late(inv, mismatch(["dry_run_hash"]), out)
        elif inv.evaluate_only:  # ADR 0090: a re-evaluation runs nothing
            accept_evaluation(inv, inv.approval_jti, inv.approved_dry_run_hash, out)
        else:
            request_execution(inv, out)
    elif inv.phase == Phase.DRY_RUN_THEN_EXECUTE:
        request_execution(inv, out)


def on_dry_run_failed(e: ev.DryRunFailed, out: Emitter) -> None:
    inv = out.state.invocations.get(e.invocation_id)
    if inv is None or inv.phase not in (
        Phase.AWAITING_DRY_RUN,
        Phase.CONFIRMING,
        Phase.DRY_RUN_THEN_EXECUTE,
    ):
        return
    code = failure_code(e.code)
    reject_late(inv, Rejection(code, f"dry-run failed: {e.message}"), out)


def settle_execution(invocation_id: str, out: Emitter) -> None:
    """C8: the outcome (folded on the call and its key by ``evolve``) is replayed to the
    calls waiting on the key."""
    inv = out.state.invocations.get(invocation_id)
    rec = key_record(out.state, inv) if inv is not None else None
    if rec is not None and rec.invocation_id == invocation_id and rec.status == KeyStatus.DONE:
        serve_waiters(rec, out)


def on_uncertain(e: ev.ExecutionUncertain, out: Emitter) -> None:
    before = out.before.invocations.get(e.invocation_id)
    if before is not None and before.phase == Phase.WAITING:  # its reconciliation's lookup
        on_lookup_failed(before, e, out)
        return
    if before is None or before.phase != Phase.EXECUTING:
        return
    inv = out.state.invocations[e.invocation_id]  # settled ``outcome_uncertain``
    rec = key_record(out.state, inv)
    if rec is None or rec.invocation_id != inv.invocation_id:
        return
    if rec.waiters:  # someone is already waiting: reconcile now (C12)
        first = out.state.invocations.get(rec.waiters[0])
        request_reconciliation(rec, first or inv, out)


def on_reconciled(e: ev.ExecutionReconciled, out: Emitter) -> None:
    """C12: the provider said what happened (recorded by ``evolve``); replay or execute
    once."""
    original_id = e.original_invocation_id or e.invocation_id
    before = out.before.invocations.get(original_id)
    if before is None or e.event_id in before.reconciliations:
        return  # unknown, or a duplicate delivery: one reconciliation, one retry at most
    original = out.state.invocations[original_id]
    rec = key_record(out.state, original)
    if e.found:
        if rec is not None and rec.invocation_id == original_id:
            serve_waiters(rec, out)
        return
    # Not applied: execute exactly once more with the same token. Only for the attempt
    # in force: the executor's restart (recover) and a retry's ReconciliationRequested
    # can both look up one attempt; the later answer must not start a second retry
    # (found by the chaos run: a second effect, or a call left executing forever).
    moved_on = rec is not None and rec.invocation_id != original_id
    if moved_on or original.started_attempt != original.attempt:
        return
    target = original
    if rec is not None and rec.waiters and original.phase == Phase.SETTLED:
        # The first call waiting on the key takes the original's call over (``evolve``:
        # the key names it, its attempt follows the original's).
        target = out.state.invocations.get(rec.waiters[0], original)
        use = out.state.approvals.get(original.approval_jti)
        if target.invocation_id != original_id and use is not None:
            # C9: the retry completes the original's confirmed call; its audit record
            # names the approval that authorizes the effect (found by the chaos run).
            out.emit(
                ev.ConfirmationAccepted,
                invocation_id=target.invocation_id,
                approval_jti=original.approval_jti,
                approved_invocation_id=use.invocation_id,
                approver=use.approver,
            )
            target = out.state.invocations[target.invocation_id]
    request_execution(target, out, attempt=original.attempt + 1)


__all__ = ["on_dry_run", "on_dry_run_failed", "on_reconciled", "on_uncertain", "settle_execution"]
