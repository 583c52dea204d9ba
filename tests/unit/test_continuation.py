"""ADR 0029: a granted approval continues the invocation that asked for it.

The approved call runs exactly as approved (same actor, tool, target, arguments, policy
version; the dry-run re-checked against what the approver saw, C5/C11), its outcome is
the invocation's, and the approval is consumed by it (single use). Resubmission keeps
its meaning (V2). Pure deciders over the in-memory runner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.harness import Gate, write_profile

from callgate.domain import events as ev

Args = dict[str, Any]
REFUND: Args = {"order_id": "ORD-1", "amount_cents": 15000, "currency": "USD"}


def test_a_granted_approval_runs_the_approved_call_once(continuing_gate: Gate) -> None:
    """The invocation executes on the grant alone; the audit names policy and approval."""
    alice = continuing_gate.session("alice", roles=("support",))
    bob = continuing_gate.session("bob", roles=("finance-approver",))
    inv = continuing_gate.propose(alice, "refunds.issue", REFUND, key="K")
    assert continuing_gate.outcome(inv) == "approval_required"
    assert continuing_gate.effects() == []
    approval = continuing_gate.approve(bob, inv)
    assert continuing_gate.outcome(inv) == "executed"
    (effect,) = continuing_gate.effects()
    assert (effect["invocation_id"], effect["tool"]) == (inv, "refunds.issue")
    (accepted,) = continuing_gate.events_of(inv, ev.ConfirmationAccepted)
    assert (accepted.approved_invocation_id, accepted.approver) == (inv, "bob")
    # the dry-run was run again and compared before the execution (C5, C11)
    kinds = [e.event_type for e in continuing_gate.events_of(inv)]
    after_grant = kinds[kinds.index("ApprovalGranted") :]
    assert after_grant[:4] == [
        "ApprovalGranted",
        "ConfirmationAccepted",
        "DryRunRequested",
        "DryRunRecorded",
    ]
    final = continuing_gate.audit(inv)[-1]
    assert final["outcome"] == "executed"
    assert final["authorized_by"]["approval"]["approver"] == "bob"
    assert final["authorized_by"]["decision"] == "permit"
    # V2: the continued call resubmitted with its key and approval is a replay
    again = continuing_gate.propose(alice, "refunds.issue", REFUND, key="K", approval_id=approval)
    assert continuing_gate.outcome(again) == "replayed"
    # changed arguments with the approval: approval_mismatch naming the binding
    changed = {**REFUND, "amount_cents": 15001}
    swapped = continuing_gate.propose(
        alice, "refunds.issue", changed, key="K2", approval_id=approval
    )
    assert continuing_gate.outcome(swapped) == "approval_mismatch"
    assert continuing_gate.error_details(swapped)["bindings"] == "args_hash"
    assert len(continuing_gate.effects()) == 1


def test_without_a_key_the_resubmitted_approval_replays(continuing_gate: Gate) -> None:
    """The approval was consumed by the continued invocation: presenting it replays."""
    alice = continuing_gate.session("alice", roles=("support",))
    bob = continuing_gate.session("bob", roles=("finance-approver",))
    inv = continuing_gate.propose(alice, "refunds.issue", REFUND)
    approval = continuing_gate.approve(bob, inv)
    assert continuing_gate.outcome(inv) == "executed"
    again = continuing_gate.propose(alice, "refunds.issue", REFUND, approval_id=approval)
    assert continuing_gate.outcome(again) == "replayed"
    assert len(continuing_gate.effects()) == 1


def test_a_changed_snapshot_stops_the_continuation(continuing_gate: Gate) -> None:
    """C5/C11: the world changed between the dry-run shown and the grant: nothing runs."""
    alice = continuing_gate.session("alice", roles=("support",))
    bob = continuing_gate.session("bob", roles=("finance-approver",))
    inv = continuing_gate.propose(alice, "refunds.issue", REFUND)
    # another refund of the same order changes what a new dry-run reports (refunded_cents)
    small = {"order_id": "ORD-1", "amount_cents": 500, "currency": "USD"}
    other = continuing_gate.propose(alice, "refunds.issue", small)
    continuing_gate.approve(alice, other)  # owner-confirmed (below the threshold)
    assert len(continuing_gate.effects()) == 1
    continuing_gate.approve(bob, inv)
    assert continuing_gate.outcome(inv) == "approval_mismatch"
    assert continuing_gate.error_details(inv)["bindings"] == "dry_run_hash"
    assert len(continuing_gate.effects()) == 1


@pytest.mark.parametrize("decision", ["deny", "expire"])
def test_denied_or_expired_approvals_never_continue(continuing_gate: Gate, decision: str) -> None:
    alice = continuing_gate.session("alice", roles=("support",))
    bob = continuing_gate.session("bob", roles=("finance-approver",))
    inv = continuing_gate.propose(alice, "refunds.issue", REFUND)
    if decision == "deny":
        continuing_gate.decide(bob, inv, "deny", "no")
    else:
        continuing_gate.runner.advance(901_000)
        continuing_gate.decide(bob, inv)
    assert continuing_gate.outcome(inv) == "approval_required"
    assert continuing_gate.events_of(inv, ev.ExecutionRequested) == []
    assert continuing_gate.effects() == []


def test_continuation_off_waits_for_the_resubmission(tmp_path: Path) -> None:
    """``continue_on_approval: false``: the grant issues the artifact and nothing runs."""
    gate = Gate(tmp_path / "state", profile=write_profile(tmp_path / "p", continuation=False))
    alice = gate.session("alice", roles=("support",))
    bob = gate.session("bob", roles=("finance-approver",))
    inv = gate.propose(alice, "refunds.issue", REFUND)
    approval = gate.approve(bob, inv)
    assert gate.effects() == []
    done = gate.propose(alice, "refunds.issue", REFUND, approval_id=approval)
    assert gate.outcome(done) == "executed"
    assert len(gate.effects()) == 1


def test_the_actor_withdraws_their_pending_call_and_no_one_else_can(continuing_gate: Gate) -> None:
    """ADR 0086 (MCP ``tasks/cancel``): the actor's withdrawal is recorded as their own
    denial, so the call never runs and a later grant is ``not_pending``; anyone else's
    withdrawal is ``approver_forbidden``, an approver's included."""
    alice = continuing_gate.session("alice", roles=("support",))
    carol = continuing_gate.session("carol", roles=("support",))
    bob = continuing_gate.session("bob", roles=("finance-approver",))
    inv = continuing_gate.propose(alice, "refunds.issue", REFUND)
    for stranger in (carol, bob):
        continuing_gate.decide(stranger, inv, ev.WITHDRAW, "not mine")
        assert (
            continuing_gate.events_of(inv, ev.ApprovalDecisionRejected)[-1].code
            == "approver_forbidden"
        )
    continuing_gate.decide(alice, inv, ev.WITHDRAW, "withdrawn")
    (denied,) = continuing_gate.events_of(inv, ev.ApprovalDenied)
    assert denied.approver == "alice" and denied.reason == "withdrawn"
    continuing_gate.decide(bob, inv)
    assert continuing_gate.events_of(inv, ev.ApprovalDecisionRejected)[-1].code == "not_pending"
    assert continuing_gate.events_of(inv, ev.ExecutionRequested) == []
    assert continuing_gate.effects() == []
