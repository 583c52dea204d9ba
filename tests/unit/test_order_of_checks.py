"""docs/contract.md "Order of checks": the first failing check is the outcome.

malformed_event → unauthenticated → unknown_tool → invalid_arguments → identity_spoof →
tool_forbidden → approval checks (approval_expired, approval_mismatch, approval_denied,
approval_consumed) → idempotency (replayed, idempotency_conflict) → dry-run and
approval_required → execution.

Each proposal below fails several checks at once; the table names them in order and
asserts that the first one wins and that nothing ran.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.harness import Gate

from callgate.domain import events as ev

TTL_MS = 900_000
REFUND: dict[str, Any] = {"order_id": "ORD-1", "amount_cents": 500, "currency": "USD"}
USED_REFUND: dict[str, Any] = {**REFUND, "order_id": "ORD-2"}
DENIED_REFUND: dict[str, Any] = {**REFUND, "order_id": "ORD-3"}
TICKET: dict[str, Any] = {"title": "t", "requester_id": "alice"}


@dataclass
class World:
    """A gate with artifacts in every state the approval and key checks distinguish."""

    g: Gate
    alice: str
    mallory: str  # valid session without any role
    stale: str  # alice's session, expired
    expired: str  # approval for alice's REFUND (key KE), past its ttl
    granted: str  # approval for alice's REFUND (key KG), unused
    used: str  # approval for alice's USED_REFUND (key KU), consumed by an execution
    effects: int  # effects after setting up

    def proposal(
        self, token: str, tool: str, args: dict[str, Any] | str, **kw: Any
    ) -> ev.ToolCallProposed:
        return self.g.proposal(token, tool, args, **kw)


@pytest.fixture
def world(tmp_path: Path) -> World:
    g = Gate(tmp_path / "state")
    day = 86_400
    alice = g.session("alice", roles=("support",), ttl=day)
    stale = g.session("alice", roles=("support",), ttl=60)
    mallory = g.session("mallory", roles=(), ttl=day)
    old = g.propose(alice, "refunds.issue", REFUND, key="KE")
    expired = g.approve(alice, old)
    g.runner.advance(TTL_MS + 1)
    pending = g.propose(alice, "refunds.issue", REFUND, key="KG")
    granted = g.approve(alice, pending)
    to_use = g.propose(alice, "refunds.issue", USED_REFUND, key="KU")
    used = g.approve(alice, to_use)
    spent = g.propose(alice, "refunds.issue", USED_REFUND, key="KU", approval_id=used)
    assert g.outcome(spent) == "executed"
    assert g.outcome(g.propose(alice, "tickets.create", TICKET, key="KT")) == "executed"
    denied = g.propose(alice, "refunds.issue", DENIED_REFUND, key="KD")
    g.decide(alice, denied, "deny")
    return World(g, alice, mallory, stale, expired, granted, used, len(g.effects()))


def misrouted(p: ev.ToolCallProposed) -> ev.ToolCallProposed:
    return dataclasses.replace(p, partition_key="somewhere-else")


Make = Callable[[World], ev.ToolCallProposed]

# (failing checks in the contract's order, the proposal); the first check is the expected outcome.
TABLE: list[tuple[tuple[str, ...], Make]] = [
    (
        ("malformed_event", "unauthenticated", "unknown_tool"),
        lambda w: misrouted(w.proposal("not-a-token", "no.such.tool", {})),
    ),
    (
        ("malformed_event", "unauthenticated", "identity_spoof"),
        lambda w: misrouted(
            w.proposal(w.stale, "tickets.create", {**TICKET, "requester_id": "bob"}, key="KX")
        ),
    ),
    (
        ("unauthenticated", "unknown_tool", "invalid_arguments"),
        lambda w: w.proposal(w.stale, "no.such.tool", "not json"),
    ),
    (
        ("unauthenticated", "identity_spoof", "tool_forbidden"),
        lambda w: w.proposal("x.y.z", "tickets.create", {**TICKET, "requester_id": "bob"}),
    ),
    (
        ("unknown_tool", "invalid_arguments", "identity_spoof"),
        lambda w: w.proposal(w.mallory, "tickets.delete", {"requester_id": "bob"}),
    ),
    (
        ("invalid_arguments", "identity_spoof", "tool_forbidden"),
        lambda w: w.proposal(w.mallory, "tickets.create", {"requester_id": "bob"}),
    ),
    (
        ("invalid_arguments", "tool_forbidden", "idempotency_conflict"),
        lambda w: w.proposal(w.mallory, "deploys.trigger", {"service": "billing"}, key="KT"),
    ),
    (
        ("identity_spoof", "tool_forbidden"),
        lambda w: w.proposal(w.mallory, "tickets.create", {**TICKET, "requester_id": "bob"}),
    ),
    (
        ("identity_spoof", "tool_forbidden (other tenant's record)"),
        lambda w: w.proposal(
            w.alice, "records.update", {"record_id": "GREC-1", "fields": {"tenant": "globex"}}
        ),
    ),
    (
        ("tool_forbidden", "approval_expired", "approval_mismatch"),
        lambda w: w.proposal(w.mallory, "refunds.issue", REFUND, key="KE", approval_id=w.expired),
    ),
    (
        ("tool_forbidden", "approval_missing"),
        lambda w: w.proposal(w.mallory, "refunds.issue", REFUND, approval_id="junk"),
    ),
    (
        ("tool_forbidden", "idempotency_conflict"),
        lambda w: w.proposal(
            w.mallory, "tickets.create", {**TICKET, "requester_id": "mallory"}, key="KT"
        ),
    ),
    (
        ("tool_forbidden (other tenant's order)", "approval_mismatch"),
        lambda w: w.proposal(
            w.alice, "refunds.issue", {**REFUND, "order_id": "GORD-1"}, approval_id=w.granted
        ),
    ),
    (
        ("approval_expired", "approval_mismatch", "idempotency_conflict"),
        lambda w: w.proposal(
            w.alice, "refunds.issue", {**REFUND, "amount_cents": 7}, key="KT", approval_id=w.expired
        ),
    ),
    (
        ("approval_mismatch", "approval_consumed"),
        lambda w: w.proposal(
            w.alice,
            "refunds.issue",
            {**USED_REFUND, "amount_cents": 7},
            key="KU",
            approval_id=w.used,
        ),
    ),
    (
        ("approval_mismatch", "idempotency_conflict"),
        lambda w: w.proposal(
            w.alice, "refunds.issue", {**REFUND, "amount_cents": 7}, key="KT", approval_id=w.granted
        ),
    ),
    (
        ("approval_missing", "idempotency_conflict"),
        lambda w: w.proposal(
            w.alice, "tickets.create", {**TICKET, "title": "u"}, key="KT", approval_id="junk"
        ),
    ),
    (
        ("approval_consumed (signed for another key's call)", "idempotency_conflict"),
        lambda w: w.proposal(w.alice, "refunds.issue", USED_REFUND, key="KT", approval_id=w.used),
    ),
    (
        ("idempotency_conflict", "approval_denied"),
        lambda w: w.proposal(
            w.alice, "refunds.issue", {**DENIED_REFUND, "amount_cents": 7}, key="KD"
        ),
    ),
    (
        ("idempotency_conflict", "approval_required"),
        lambda w: w.proposal(w.alice, "refunds.issue", {**REFUND, "amount_cents": 20000}, key="KT"),
    ),
    (
        ("approval_denied", "approval_required"),
        lambda w: w.proposal(w.alice, "refunds.issue", DENIED_REFUND, key="KD"),
    ),
]


def _code(check: str) -> str:
    return check.split(" ", 1)[0]


@pytest.mark.parametrize(
    ("failing", "make"), TABLE, ids=[" > ".join(_code(c) for c in row[0]) for row in TABLE]
)
def test_the_first_failing_check_is_the_outcome(
    world: World, failing: tuple[str, ...], make: Make
) -> None:
    """docs/contract.md order of checks: a proposal failing several checks gets the first one's
    code,
    and none of the later stages (dry-run, execution) runs."""
    g = world.g
    p = make(world)
    g.runner.publish(p)
    g.runner.run()
    assert g.outcome(p.invocation_id) == _code(failing[0])
    assert g.status(p.invocation_id)["error"]["code"] == _code(failing[0])
    for cls in (ev.DryRunRequested, ev.ExecutionRequested, ev.ReplayServed):
        assert not g.events_of(p.invocation_id, cls)
    assert len(g.effects()) == world.effects


def test_fixing_each_failure_reveals_the_next_check(world: World) -> None:
    """docs/contract.md order of checks, as a ladder: one proposal starts out failing every check;
    fixing the first failure each time yields the next code, down to execution."""
    w, g = world, world.g
    bad = {"order_id": "GORD-1", "amount_cents": "lots", "currency": "USD", "issued_by": "bob"}
    ladder: list[tuple[str, ev.ToolCallProposed]] = [
        ("malformed_event", misrouted(w.proposal("not-a-token", "refunds.give", bad))),
        ("unauthenticated", w.proposal("not-a-token", "refunds.give", bad)),
        ("unknown_tool", w.proposal(w.alice, "refunds.give", bad)),
        ("invalid_arguments", w.proposal(w.alice, "refunds.issue", bad)),
        ("identity_spoof", w.proposal(w.alice, "refunds.issue", {**bad, "amount_cents": 7})),
        (
            "tool_forbidden",
            w.proposal(w.alice, "refunds.issue", {**REFUND, "order_id": "GORD-1"}, key="KT"),
        ),
        (
            "approval_expired",
            w.proposal(
                w.alice,
                "refunds.issue",
                {**REFUND, "amount_cents": 7},
                key="KT",
                approval_id=w.expired,
            ),
        ),
        (
            "approval_mismatch",
            w.proposal(
                w.alice,
                "refunds.issue",
                {**REFUND, "amount_cents": 7},
                key="KT",
                approval_id=w.granted,
            ),
        ),
        ("idempotency_conflict", w.proposal(w.alice, "refunds.issue", REFUND, key="KT")),
        ("approval_required", w.proposal(w.alice, "refunds.issue", REFUND, key="KN")),
        ("executed", w.proposal(w.alice, "refunds.issue", REFUND, key="KG", approval_id=w.granted)),
        ("replayed", w.proposal(w.alice, "refunds.issue", REFUND, key="KG")),
    ]
    seen = []
    for _, p in ladder:
        g.runner.publish(p)
        g.runner.run()
        seen.append(g.outcome(p.invocation_id))
    assert seen == [code for code, _ in ladder]
    assert len(g.effects()) == world.effects + 1
