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
from typing import TypeVar

from callgate.decider import input_folds as inputs
from callgate.decider import output_folds as outputs
from callgate.decider.state import DeciderState
from callgate.domain import events as ev

E = TypeVar("E", bound=ev.Event)


def evolve(state: DeciderState, event: ev.Event) -> DeciderState:
    """``state`` after ``event`` (the same object when it changes nothing)."""
    fold = _FOLDS.get(type(event))
    return state if fold is None else fold(state, event)


def _fold(
    fn: Callable[[DeciderState, E], DeciderState],
) -> Callable[[DeciderState, ev.Event], DeciderState]:
    return fn  # type: ignore[return-value]  # dispatched by the event's exact type below


_FOLDS: dict[type[ev.Event], Callable[[DeciderState, ev.Event], DeciderState]] = {
    ev.ProposalRejected: _fold(outputs.rejected),
    ev.PolicyDecided: _fold(outputs.decided),
    ev.ResourceDescriptionRequested: _fold(outputs.describing),
    ev.UsageReserveRequested: _fold(outputs.reserving),
    ev.ConfirmationAccepted: _fold(outputs.confirmed),
    ev.DryRunRequested: _fold(outputs.dry_run_requested),
    ev.ApprovalRequested: _fold(outputs.approval_requested),
    ev.ExecutionRequested: _fold(outputs.execution_requested),
    ev.ReplayServed: _fold(outputs.replayed),
    ev.ReplayAwaited: _fold(outputs.awaiting),
    ev.ReconciliationRequested: _fold(outputs.reconciling),
    ev.ApprovalGrantRecorded: _fold(outputs.grant_recorded),
    ev.ApprovalGranted: _fold(outputs.granted),
    ev.ApprovalDenied: _fold(outputs.denied),
    ev.ApprovalExpired: _fold(outputs.expired),
    ev.UsageCommitted: _fold(outputs.usage_settled),
    ev.UsageReleased: _fold(outputs.usage_settled),
    ev.ApprovalDecisionSubmitted: _fold(inputs.decision_seen),
    ev.ExecutionStarted: _fold(inputs.started),
    ev.DryRunRecorded: _fold(inputs.dry_run_recorded),
    ev.ExecutionSucceeded: _fold(inputs.succeeded),
    ev.ExecutionFailed: _fold(inputs.failed),
    ev.ExecutionUncertain: _fold(inputs.uncertain),
    ev.ExecutionReconciled: _fold(inputs.reconciled),
    ev.UsageReserved: _fold(inputs.usage_answered),
    ev.UsageRefused: _fold(inputs.usage_answered),
}

__all__ = ["evolve"]
