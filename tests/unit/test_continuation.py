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


@pytest.fixture
def g(tmp_path: Path) -> Gate:
    return Gate(tmp_path / "state", continuation=True)


def test_a_granted_approval_runs_the_approved_call_once(g: Gate) -> None:
    """The invocation executes on the grant alone; the audit names policy and approval."""
    alice = g.session("alice", roles=("support",))
    bob = g.session("bob", roles=("finance-approver",))
    inv = g.propose(alice, "refunds.issue", REFUND, key="K")
    assert g.outcome(inv) == "approval_required"
    assert g.effects() == []
    approval = g.approve(bob, inv)
    assert g.outcome(inv) == "executed"
    (effect,) = g.effects()
    assert (effect["invocation_id"], effect["tool"]) == (inv, "refunds.issue")
    (accepted,) = g.events_of(inv, ev.ConfirmationAccepted)
    assert (accepted.approved_invocation_id, accepted.approver) == (inv, "bob")
    # the dry-run was run again and compared before the execution (C5, C11)
    kinds = [e.event_type for e in g.events_of(inv)]
    after_grant = kinds[kinds.index("ApprovalGranted") :]
    assert after_grant[:4] == [
        "ApprovalGranted",
        "ConfirmationAccepted",
        "DryRunRequested",
        "DryRunRecorded",
    ]
    final = g.audit(inv)[-1]
    assert final["outcome"] == "executed"
    assert final["authorized_by"]["approval"]["approver"] == "bob"
    assert final["authorized_by"]["decision"] == "permit"
    # V2: the continued call resubmitted with its key and approval is a replay
    again = g.propose(alice, "refunds.issue", REFUND, key="K", approval_id=approval)
    assert g.outcome(again) == "replayed"
    # changed arguments with the approval: approval_mismatch naming the binding
    changed = {**REFUND, "amount_cents": 15001}
    swapped = g.propose(alice, "refunds.issue", changed, key="K2", approval_id=approval)
    assert g.outcome(swapped) == "approval_mismatch"
    assert g.error_details(swapped)["bindings"] == "args_hash"
    assert len(g.effects()) == 1


def test_without_a_key_the_resubmitted_approval_replays(g: Gate) -> None:
    """The approval was consumed by the continued invocation: presenting it replays."""
    alice = g.session("alice", roles=("support",))
    bob = g.session("bob", roles=("finance-approver",))
    inv = g.propose(alice, "refunds.issue", REFUND)
    approval = g.approve(bob, inv)
    assert g.outcome(inv) == "executed"
    again = g.propose(alice, "refunds.issue", REFUND, approval_id=approval)
    assert g.outcome(again) == "replayed"
    assert len(g.effects()) == 1


def test_a_changed_snapshot_stops_the_continuation(g: Gate) -> None:
    """C5/C11: the world changed between the dry-run shown and the grant: nothing runs."""
    alice = g.session("alice", roles=("support",))
    bob = g.session("bob", roles=("finance-approver",))
    inv = g.propose(alice, "refunds.issue", REFUND)
    # another refund of the same order changes what a new dry-run reports (refunded_cents)
    small = {"order_id": "ORD-1", "amount_cents": 500, "currency": "USD"}
    other = g.propose(alice, "refunds.issue", small)
    g.approve(alice, other)  # owner-confirmed (below the threshold)
    assert len(g.effects()) == 1
    g.approve(bob, inv)
    assert g.outcome(inv) == "approval_mismatch"
    assert g.error_details(inv)["bindings"] == "dry_run_hash"
    assert len(g.effects()) == 1


@pytest.mark.parametrize("decision", ["deny", "expire"])
def test_denied_or_expired_approvals_never_continue(g: Gate, decision: str) -> None:
    alice = g.session("alice", roles=("support",))
    bob = g.session("bob", roles=("finance-approver",))
    inv = g.propose(alice, "refunds.issue", REFUND)
    if decision == "deny":
        g.decide(bob, inv, "deny", "no")
    else:
        g.runner.advance(901_000)
        g.decide(bob, inv)
    assert g.outcome(inv) == "approval_required"
    assert g.events_of(inv, ev.ExecutionRequested) == []
    assert g.effects() == []


def test_continuation_off_waits_for_the_resubmission(tmp_path: Path) -> None:
    """``continue_on_approval: false``: the grant issues the artifact and nothing runs."""
    g = Gate(tmp_path / "state", profile=write_profile(tmp_path / "p", continuation=False))
    alice = g.session("alice", roles=("support",))
    bob = g.session("bob", roles=("finance-approver",))
    inv = g.propose(alice, "refunds.issue", REFUND)
    approval = g.approve(bob, inv)
    assert g.effects() == []
    done = g.propose(alice, "refunds.issue", REFUND, approval_id=approval)
    assert g.outcome(done) == "executed"
    assert len(g.effects()) == 1


def test_the_actor_withdraws_their_pending_call_and_no_one_else_can(g: Gate) -> None:
    """ADR 0086 (MCP ``tasks/cancel``): the actor's withdrawal is recorded as their own
    denial, so the call never runs and a later grant is ``not_pending``; anyone else's
    withdrawal is ``approver_forbidden``, an approver's included."""
    alice = g.session("alice", roles=("support",))
    carol = g.session("carol", roles=("support",))
    bob = g.session("bob", roles=("finance-approver",))
    inv = g.propose(alice, "refunds.issue", REFUND)
    for stranger in (carol, bob):
        g.decide(stranger, inv, ev.WITHDRAW, "not mine")
        assert g.events_of(inv, ev.ApprovalDecisionRejected)[-1].code == "approver_forbidden"
    g.decide(alice, inv, ev.WITHDRAW, "withdrawn")
    (denied,) = g.events_of(inv, ev.ApprovalDenied)
    assert denied.approver == "alice" and denied.reason == "withdrawn"
    g.decide(bob, inv)
    assert g.events_of(inv, ev.ApprovalDecisionRejected)[-1].code == "not_pending"
    assert g.events_of(inv, ev.ExecutionRequested) == []
    assert g.effects() == []
