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
    key_record,
    on_lookup_failed,
    request_reconciliation,
    serve_waiters,
)
from callgate.decider.state import DeciderState, KeyStatus, Phase
from callgate.domain import events as ev
from callgate.domain.codes import Code, Rejection, failure_code


def on_dry_run(state: DeciderState, e: ev.DryRunRecorded, out: Emitter) -> None:
    inv = state.invocations.get(e.invocation_id)
    if inv is None:
        return
    if inv.phase == Phase.AWAITING_DRY_RUN:
        request_approval(state, inv, e.snapshot_json, e.snapshot_hash, out)
    elif inv.phase == Phase.CONFIRMING:
        inv.dry_run_json, inv.dry_run_hash = e.snapshot_json, e.snapshot_hash
        if e.snapshot_hash != inv.approved_dry_run_hash:
            # The world changed since the human confirmed: that approval no longer covers it.
            reject_late(state, inv, mismatch(["dry_run_hash"]), out)
        elif inv.evaluate_only:
            accept_evaluation(state, inv, out)  # ADR 0090: a re-evaluation runs nothing
        else:
            request_execution(state, inv, out)
    elif inv.phase == Phase.DRY_RUN_THEN_EXECUTE:
        inv.dry_run_json, inv.dry_run_hash = e.snapshot_json, e.snapshot_hash
        request_execution(state, inv, out)


def on_dry_run_failed(state: DeciderState, e: ev.DryRunFailed, out: Emitter) -> None:
    inv = state.invocations.get(e.invocation_id)
    if inv is None or inv.phase not in (
        Phase.AWAITING_DRY_RUN,
        Phase.CONFIRMING,
        Phase.DRY_RUN_THEN_EXECUTE,
    ):
        return
    code = failure_code(e.code)
    reject_late(state, inv, Rejection(code, f"dry-run failed: {e.message}"), out)


def settle_execution(
    state: DeciderState,
    invocation_id: str,
    outcome: Code,
    result_json: str,
    out: Emitter,
) -> None:
    inv = state.invocations.get(invocation_id)
    if inv is None or (inv.phase == Phase.SETTLED and inv.outcome != Code.OUTCOME_UNCERTAIN):
        return
    inv.phase, inv.outcome, inv.result_json = Phase.SETTLED, outcome.value, result_json
    rec = key_record(state, inv)
    if rec is not None and rec.invocation_id == invocation_id:
        rec.status, rec.outcome, rec.result_json = KeyStatus.DONE, outcome.value, result_json
        serve_waiters(state, rec, out)


def on_uncertain(state: DeciderState, e: ev.ExecutionUncertain, out: Emitter) -> None:
    inv = state.invocations.get(e.invocation_id)
    if inv is not None and inv.phase == Phase.WAITING:  # its reconciliation's lookup failed
        on_lookup_failed(state, inv, e, out)
        return
    if inv is None or inv.phase != Phase.EXECUTING:
        return
    inv.phase, inv.outcome = Phase.SETTLED, Code.OUTCOME_UNCERTAIN.value
    # The executor reports an outcome only for a run it started, so the attempt in force
    # has started even if its ExecutionStarted was not seen: the decider's two input
    # topics (``requests``, ``events``) are not ordered with each other. Without this the
    # reconciliation below would never retry (calls left waiting forever).
    inv.started_attempt = max(inv.started_attempt, inv.attempt)
    rec = key_record(state, inv)
    if rec is None or rec.invocation_id != inv.invocation_id:
        return
    rec.status = KeyStatus.UNCERTAIN
    if rec.waiters:  # someone is already waiting: reconcile now (C12)
        first = state.invocations.get(rec.waiters[0])
        request_reconciliation(state, rec, first or inv, out)


def on_reconciled(state: DeciderState, e: ev.ExecutionReconciled, out: Emitter) -> None:
    """C12: the provider said what happened; record it, then replay or execute once."""
    original_id = e.original_invocation_id or e.invocation_id
    original = state.invocations.get(original_id)
    if original is None or e.event_id in original.reconciliations:
        return  # unknown, or a duplicate delivery: one reconciliation, one retry at most
    original.reconciliations.append(e.event_id)
    rec = key_record(state, original)
    if e.found:
        original.phase, original.outcome = Phase.SETTLED, Code.EXECUTED.value
        original.result_json = e.result_json
        if rec is not None and rec.invocation_id == original_id:
            rec.status, rec.outcome, rec.result_json = (
                KeyStatus.DONE,
                Code.EXECUTED.value,
                e.result_json,
            )
            serve_waiters(state, rec, out)
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
        target = state.invocations.get(rec.waiters.pop(0), original)
        target.execution_token = original.execution_token
        target.attempt = original.attempt
        rec.invocation_id = target.invocation_id
        use = state.approvals.get(original.approval_jti)
        if target is not original and use is not None:
            # C9: the retry completes the original's confirmed call; its audit record
            # names the approval that authorizes the effect (found by the chaos run).
            target.approval_jti = original.approval_jti
            out.emit(
                ev.ConfirmationAccepted,
                invocation_id=target.invocation_id,
                approval_jti=original.approval_jti,
                approved_invocation_id=use.invocation_id,
                approver=use.approver,
            )
    request_execution(state, target, out)


__all__ = ["on_dry_run", "on_dry_run_failed", "on_reconciled", "on_uncertain", "settle_execution"]
