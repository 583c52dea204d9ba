"""ADR 0054: freezes are a pure fold of the log's freeze events; the decider refuses a
matching call ``frozen``, a continuation of an approval already granted included."""

from __future__ import annotations

import pytest
from tests.harness import Gate

from callgate.domain import events as ev
from callgate.domain.codes import Code, Rejection
from callgate.domain.freeze import FREEZE_KEY, Freezes, checked_request, evolve
from callgate.executor.invocations import Invocations

REFUND = {"order_id": "ORD-1", "amount_cents": 15000, "currency": "USD"}


def freeze_event(scope: str, value: str, lift: bool = False, n: int = 1) -> ev.Event:
    kind = ev.FreezeLifted if lift else ev.FreezeApplied
    return kind(
        event_id=f"fz-{n}",
        invocation_id=f"{FREEZE_KEY}-{n}",
        partition_key=FREEZE_KEY,
        scope=scope,
        value=value,
        reason="incident",
        author="olga",
        tenant="ops",
    )


def test_the_fold_applies_and_lifts_exactly() -> None:
    freezes = Freezes()
    freezes = evolve(freezes, freeze_event("tool", "refunds.issue"))
    freezes = evolve(freezes, freeze_event("actor", "mallory", n=2))
    assert freezes.matching("refunds.issue", "acme", "alice") is not None
    assert freezes.matching("Refunds.issue", "acme", "alice") is None  # exact names
    assert freezes.matching("tickets.read", "acme", "mallory") is not None
    with pytest.raises(Rejection) as refused:
        freezes.check("refunds.issue", "acme", "alice")
    assert refused.value.code == Code.FROZEN and "incident" in refused.value.message
    freezes = evolve(freezes, freeze_event("tool", "refunds.issue", lift=True, n=3))
    assert freezes.matching("refunds.issue", "acme", "alice") is None
    assert freezes.matching("x", "acme", "mallory") is not None  # the other freeze stays


@pytest.mark.parametrize(
    ("scope", "value", "reason"),
    [
        ("tools", "a", "r"),
        ("tool", "", "r"),
        ("tool", " a", "r"),
        ("tool", "a\u200b\x00", "r"),
        ("tool", "a" * 201, "r"),
        ("tool", "a", ""),
        ("tool", "a", "r\x1b[2J"),
    ],
)
def test_bad_requests_are_invalid_request(scope: str, value: str, reason: str) -> None:
    with pytest.raises(Rejection) as refused:
        checked_request(scope, value, reason, lifting=False)
    assert refused.value.code == Code.INVALID_REQUEST


def test_a_freeze_stops_the_continuation_of_a_pending_approval(continuing_gate: Gate) -> None:
    alice = continuing_gate.session("alice", roles=("support",))
    bob = continuing_gate.session("bob", roles=("finance-approver",))
    inv = continuing_gate.propose(alice, "refunds.issue", REFUND, key="K")
    assert continuing_gate.outcome(inv) == "approval_required"
    continuing_gate.runner.publish(freeze_event("tool", "refunds.issue"))
    continuing_gate.runner.run()
    continuing_gate.decide(bob, inv)
    assert continuing_gate.outcome(inv) == "frozen"
    assert continuing_gate.events_of(inv, ev.ExecutionRequested) == []
    assert continuing_gate.effects() == []
    # Lifted: a new call runs again.
    continuing_gate.runner.publish(freeze_event("tool", "refunds.issue", lift=True, n=2))
    continuing_gate.runner.run()
    again = continuing_gate.propose(alice, "refunds.issue", {**REFUND, "amount_cents": 500})
    assert continuing_gate.outcome(again) == "approval_required"  # the owner confirms: not frozen


def test_a_freeze_folded_before_the_grant_stops_its_continuation(continuing_gate: Gate) -> None:
    """The grant continues the call (ADR 0029): its confirming dry-run, the check and the
    execution request are one step of the invocations process (ADR 0077). A freeze folded
    before that step stops the call there, before any execution is requested."""
    alice = continuing_gate.session("alice", roles=("support",))
    bob = continuing_gate.session("bob", roles=("finance-approver",))
    inv = continuing_gate.propose(alice, "refunds.issue", REFUND, key="K")
    continuing_gate.record_provider_calls()
    continuing_gate.runner.publish(freeze_event("tenant", "acme"))
    continuing_gate.runner.run()
    continuing_gate.decide(bob, inv)
    assert continuing_gate.outcome(inv) == "frozen"
    assert continuing_gate.events_of(inv, ev.ExecutionRequested) == []
    assert continuing_gate.calls == [] and continuing_gate.effects() == []


def test_a_freeze_that_lands_during_a_step_applies_from_the_next(continuing_gate: Gate) -> None:
    """A freeze published while a step runs (here: during the grant's confirming dry-run)
    is folded after that step: the step's call goes on as decided, the next one is refused.
    The step is one transaction, so this is the race ADR 0064 names (either side of the
    event), not a gap in a call's checks."""
    alice = continuing_gate.session("alice", roles=("support",))
    bob = continuing_gate.session("bob", roles=("finance-approver",))
    inv = continuing_gate.propose(alice, "refunds.issue", REFUND, key="K")
    armed = False

    def note(call: tuple[str, str]) -> None:
        if armed and call[0] == "dry_run":
            continuing_gate.runner.publish(freeze_event("tenant", "acme"))

    continuing_gate.calls = _Notes(note)
    continuing_gate.record_provider_calls()
    armed = True
    continuing_gate.decide(bob, inv)
    assert continuing_gate.events_of(inv, ev.ConfirmationAccepted), "the grant continued the call"
    assert continuing_gate.outcome(inv) == "executed"
    assert len(continuing_gate.effects()) == 1
    later = continuing_gate.propose(alice, "refunds.issue", {**REFUND, "amount_cents": 500})
    assert continuing_gate.outcome(later) == "frozen"


class _Notes(list[tuple[str, str]]):
    def __init__(self, note: object) -> None:
        super().__init__()
        self._note = note

    def append(self, call: tuple[str, str]) -> None:
        self._note(call)  # type: ignore[operator]
        super().append(call)


def test_the_decider_folds_a_control_event_once_so_a_late_copy_undoes_nothing(
    continuing_gate: Gate,
) -> None:
    """ADR 0064: on Kafka a worker gets a control event from its global input and again from
    the partition it owns (and again at a restart); folding the old ``FreezeApplied`` after
    its ``FreezeLifted`` would stop the tool again."""
    (decider,) = (p.decider for p in continuing_gate.app.processes() if isinstance(p, Invocations))
    applied, lifted = (
        freeze_event("tool", "refunds.issue"),
        freeze_event("tool", "refunds.issue", lift=True, n=2),
    )
    decider.seed([applied, lifted])
    decider.handle(decider.initial_state(), applied, 0)  # the owned partition's copy, late
    decider.seed([applied])  # and the global input's, again
    assert decider.deps.freezes.matching("refunds.issue", "acme", "alice") is None
    decider.seed([freeze_event("tool", "refunds.issue", n=3)])  # a new freeze still folds
    assert decider.deps.freezes.matching("refunds.issue", "acme", "alice") is not None
