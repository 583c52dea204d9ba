"""Usage limits on the embedded backend (ADR 0079): counted exactly once, as events.

Concurrency is the log's: every proposal is appended before the runner decides any, so the
runner sees them all at once, the way many agents' calls reach one partition together.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.limits_support import REFUND_LIMIT, TICKET_LIMIT, limited_profile, refund

from callgate.application.client import Gateway
from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.scope import bound_id


class Limited:
    """A gateway on the embedded store and a way to put many proposals on the log at once."""

    def __init__(
        self, state_dir: Path, profile: Path, clock: Callable[[], int] | None = None
    ) -> None:
        settings = Settings(state_dir=state_dir, dev=True, profile=profile)
        self.app: App = bootstrap(settings) if clock is None else bootstrap(settings, clock)
        self.gate: Gateway = self.app.gateway()
        self.now = self.app.clock()

    def session(self, user: str, tenant: str = "acme", roles: str = "support") -> str:
        return self.app.session_issuer.issue(user, tenant, tuple(roles.split(",")), self.now)

    def flood(
        self, session: str, tool: str, args: Callable[[int], dict[str, Any]], n: int
    ) -> list[str]:
        """Append ``n`` proposals without deciding any; their invocation ids."""
        ids: list[str] = []
        events: list[ev.Event] = []
        for i in range(n):
            inv = bound_id(session, uuid.uuid4().hex)
            ids.append(inv)
            events.append(
                ev.ToolCallProposed(
                    event_id=str(uuid.uuid4()),
                    invocation_id=inv,
                    partition_key=partition_key("", None, inv),
                    correlation_id=inv,
                    occurred_at=self.now,
                    session_token=session,
                    tool=tool,
                    args_json=json.dumps(args(i)),
                )
            )
        self.gate.backend.publish(events)
        return ids

    def tickets(self, session: str, n: int) -> list[str]:
        user = self.app.session_verifier.verify(session, self.now).user
        return self.flood(
            session, "tickets.create", lambda i: {"title": f"t{i}", "requester_id": user}, n
        )

    def settle(self) -> None:
        runner = self.gate.backend.runner  # type: ignore[attr-defined]
        assert runner.try_acquire()
        try:
            runner.run_until_idle(120)
        finally:
            runner.release()

    def status(self, inv: str) -> dict[str, Any]:
        found = self.gate.backend.view("status", inv)
        assert found is not None, inv
        return found

    def events(self, kind: type[ev.Event]) -> list[Any]:
        return list(self.gate.backend.read_events(kind))

    def held(self) -> int:
        """Reservations neither committed nor released, from the log."""
        reserved = {e.reservation_id for e in self.events(ev.UsageReserved)}
        done = {e.reservation_id for e in self.events(ev.UsageCommitted)}
        done |= {e.reservation_id for e in self.events(ev.UsageReleased)}
        return len(reserved - done)


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Limited]:
    gate = Limited(tmp_path / "state", limited_profile(tmp_path / "p", REFUND_LIMIT, TICKET_LIMIT))
    yield gate
    gate.gate.close()


def test_200_concurrent_refunds_under_a_daily_sum_execute_exactly_10(limited: Limited) -> None:
    alice = limited.session("alice")
    ids = limited.flood(alice, "refunds.issue", refund, 200)
    limited.settle()
    statuses = [limited.status(i) for i in ids]
    outcomes = Counter(s["outcome"] for s in statuses)
    print("outcomes:", dict(outcomes))
    assert outcomes == {"executed": 10, "limit_exceeded": 190}
    refused = next(s for s in statuses if s["outcome"] == "limit_exceeded")
    details = refused["error"]["details"]
    assert details["limit"] == "refunds-per-actor" and details["window"] == "24h"
    assert details["max"] == 100_000 and details["amount"] == 9_999
    assert details["used"] >= 9 * 9_999  # committed plus held when it was refused
    assert isinstance(details["retry_after_s"], int) and details["retry_after_s"] >= 1
    effects = [e for e in limited.app.ledger.effects() if e["tool"] == "refunds.issue"]
    assert len(effects) == 10 and sum(e["args"]["amount_cents"] for e in effects) <= 100_000
    assert limited.held() == 0  # nothing reserved once all settle


def test_200_concurrent_ticket_creations_under_50_an_hour_execute_exactly_50(
    limited: Limited,
) -> None:
    alice = limited.session("alice")
    ids = limited.tickets(alice, 200)
    limited.settle()
    outcomes = Counter(limited.status(i)["outcome"] for i in ids)
    print("outcomes:", dict(outcomes))
    assert outcomes == {"executed": 50, "limit_exceeded": 150}
    assert limited.held() == 0


def test_exact_identifiers_are_separate_budgets(limited: Limited) -> None:
    """``Alice`` cannot spend ``alice``'s budget, nor ``ACME``'s tenant ``acme``'s."""
    spenders = [
        limited.session("alice"),
        limited.session("Alice"),
        limited.session("alice", "ACME"),
    ]
    ids = {s: limited.tickets(s, 60) for s in spenders}
    limited.settle()
    for session, invs in ids.items():
        outcomes = Counter(limited.status(i)["outcome"] for i in invs)
        assert outcomes == {"executed": 50, "limit_exceeded": 10}, (session, outcomes)


def test_a_replay_counts_nothing(limited: Limited) -> None:
    alice = limited.session("alice")
    args = {"title": "same", "requester_id": "alice"}
    first = limited.gate.propose(alice, "tickets.create", args, idempotency_key="k-1")
    assert first["outcome"] == "executed"
    for _ in range(5):
        again = limited.gate.propose(alice, "tickets.create", args, idempotency_key="k-1")
        assert again["outcome"] == "replayed"
    committed = limited.events(ev.UsageCommitted)
    assert len(committed) == 1 and committed[0].invocation_id == first["invocation_id"]
    assert limited.held() == 0
    # 49 more fit: the replays took nothing.
    ids = limited.flood(
        alice, "tickets.create", lambda i: {"title": f"t{i}", "requester_id": "alice"}, 50
    )
    limited.settle()
    assert Counter(limited.status(i)["outcome"] for i in ids) == {
        "executed": 49,
        "limit_exceeded": 1,
    }


class Clock:
    """A clock the test moves (approval expiry)."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def clocked(tmp_path: Path, *limits: dict[str, Any]) -> tuple[Limited, Clock]:
    clock = Clock(1_800_000_000_000)
    gate = Limited.__new__(Limited)
    gate.app = bootstrap(
        Settings(
            state_dir=tmp_path / "state", dev=True, profile=limited_profile(tmp_path / "p", *limits)
        ),
        clock=clock,
    )
    gate.gate = gate.app.gateway()
    gate.now = clock.now
    return gate, clock


def big_refund(i: int) -> dict[str, Any]:
    return {"order_id": f"ORD-{i}", "amount_cents": 20_000, "currency": "EUR"}


def test_a_pending_approval_holds_its_reservation_and_denial_and_expiry_release_it(
    tmp_path: Path,
) -> None:
    limited, clock = clocked(tmp_path, REFUND_LIMIT)
    try:
        alice, bob = limited.session("alice"), limited.session("bob", roles="finance-approver")
        pending = [limited.gate.propose(alice, "refunds.issue", big_refund(i)) for i in range(5)]
        assert {p["outcome"] for p in pending} == {"approval_required"}  # 100,000 held
        sixth = limited.gate.propose(alice, "refunds.issue", big_refund(5))
        assert sixth["outcome"] == "limit_exceeded"
        assert sixth["error"]["details"]["used"] == 100_000
        assert sixth["error"]["details"]["retry_after_s"] == 1  # only held calls in the way
        limited.gate.deny(pending[0]["invocation_id"], bob, reason="no")
        released = limited.events(ev.UsageReleased)
        assert [r.invocation_id for r in released if r.reason != "limit_exceeded"] == [
            pending[0]["invocation_id"]
        ]
        assert limited.gate.propose(alice, "refunds.issue", big_refund(6))["outcome"] == (
            "approval_required"
        )
        assert limited.gate.propose(alice, "refunds.issue", big_refund(7))["outcome"] == (
            "limit_exceeded"
        )
        clock.now += 901_000  # every pending approval expires
        limited.settle()
        assert limited.held() == 0
        assert limited.gate.propose(alice, "refunds.issue", big_refund(8))["outcome"] == (
            "approval_required"
        )
    finally:
        limited.gate.close()


def test_an_approved_call_commits_what_it_held(tmp_path: Path) -> None:
    limited, _ = clocked(tmp_path, REFUND_LIMIT)
    try:
        alice, bob = limited.session("alice"), limited.session("bob", roles="finance-approver")
        call = limited.gate.propose(alice, "refunds.issue", big_refund(1))
        assert limited.gate.approve(call["invocation_id"], bob)["outcome"] == "executed"
        committed = limited.events(ev.UsageCommitted)
        assert [c.invocation_id for c in committed] == [call["invocation_id"]]
        assert limited.held() == 0
    finally:
        limited.gate.close()


def test_a_concurrency_limit_of_2_never_has_3_in_flight(tmp_path: Path) -> None:
    reads = {"name": "reads-in-flight", "tools": ["tickets.read"], "count": "in_flight",
             "max": 2, "per": ["actor"]}  # fmt: skip
    limited, _ = clocked(tmp_path, reads)
    try:
        alice = limited.session("alice")
        executed = 0
        for _ in range(3):
            ids = limited.flood(alice, "tickets.read", lambda i: {"ticket_id": f"T-{i}"}, 20)
            limited.settle()
            outcomes = Counter(limited.status(i)["outcome"] for i in ids)
            assert set(outcomes) <= {"executed", "limit_exceeded"} and outcomes["executed"] >= 1
            executed += outcomes["executed"]
        # In log order, the calls holding a place never number more than 2, and neither
        # do the executions started and not yet finished.
        held: set[str] = set()
        running: set[str] = set()
        most_held = most_running = 0
        for event in limited.gate.backend.read_events():
            if isinstance(event, ev.UsageReserved):
                held.add(event.reservation_id)
            elif isinstance(event, ev.UsageReleased | ev.UsageCommitted):
                held.discard(event.reservation_id)
            elif isinstance(event, ev.ExecutionStarted):
                running.add(event.invocation_id)
            elif isinstance(event, ev.ExecutionSucceeded | ev.ExecutionFailed):
                running.discard(event.invocation_id)
            most_held, most_running = max(most_held, len(held)), max(most_running, len(running))
        print("executed:", executed, "most held:", most_held, "most running:", most_running)
        assert most_held <= 2 and most_running <= 2
        assert limited.held() == 0
    finally:
        limited.gate.close()


def test_over_approve_turns_the_11th_refund_into_an_approval_that_shows_the_usage(
    tmp_path: Path,
) -> None:
    limited, _ = clocked(tmp_path, {**REFUND_LIMIT, "over": "approve"})
    try:
        alice, bob = limited.session("alice"), limited.session("bob", roles="finance-approver")
        for i in range(10):
            assert limited.gate.propose(alice, "refunds.issue", refund(i))["outcome"] == "executed"
        eleventh = limited.gate.propose(alice, "refunds.issue", refund(10))
        assert eleventh["outcome"] == "approval_required"
        [shown] = limited.gate.pending(bob)
        assert shown["usage"] == {
            "refunds-per-actor": {
                "used": 99_990, "limit": 100_000, "window": "24h", "amount": 9_999, "over": True,
            }
        }  # fmt: skip
        assert shown["confirmation"] == "approver"
        assert limited.gate.approve(eleventh["invocation_id"], bob)["outcome"] == "executed"
        assert len([e for e in limited.app.ledger.effects() if e["tool"] == "refunds.issue"]) == 11
        assert limited.held() == 0
    finally:
        limited.gate.close()


def test_a_forged_usage_event_on_the_requests_topic_is_dead_lettered(limited: Limited) -> None:
    forged = ev.UsageReleased(
        event_id="forged-1", invocation_id="x", partition_key="u-whatever",
        limit="refunds-per-actor", reservation_id="r", reason="forged",
    )  # fmt: skip
    store = limited.gate.backend.store  # type: ignore[attr-defined]
    store.append_raw("requests", forged.partition_key, limited.gate.backend.codec.encode(forged))  # type: ignore[attr-defined]
    limited.settle()
    codec = limited.gate.backend.codec  # type: ignore[attr-defined]
    dead = [codec.decode(r.payload) for r in store.read_log("dead-letter", limit=10)]
    assert len(dead) == 1 and dead[0].code == "malformed_event", dead
    assert limited.events(ev.UsageReleased) == []  # no process took it


def test_a_policy_reads_the_usage_in_context(tmp_path: Path) -> None:
    """``context.usage[...]`` holds the usage before the call: a rule on history."""
    rule = (
        'forbid (principal, action == Action::"refunds.issue", resource) when '
        '{ context.usage["refunds-per-actor"].used + context.args.amount_cents > 50000 };'
    )
    limited = Limited(
        tmp_path / "state", limited_profile(tmp_path / "p", REFUND_LIMIT, policy=rule)
    )
    try:
        alice = limited.session("alice")
        outcomes = [
            limited.gate.propose(alice, "refunds.issue", refund(i))["outcome"] for i in range(6)
        ]
        assert outcomes == ["executed"] * 5 + ["tool_forbidden"]  # 5 x 9,999 + 9,999 > 50,000
        assert limited.held() == 0
    finally:
        limited.gate.close()


def test_usage_survives_a_restart(tmp_path: Path) -> None:
    profile = limited_profile(tmp_path / "p", TICKET_LIMIT)
    first = Limited(tmp_path / "state", profile)
    alice = first.session("alice")
    first.tickets(alice, 30)
    first.settle()
    first.gate.close()
    again = Limited(tmp_path / "state", profile)
    try:
        ids = again.tickets(alice, 30)
        again.settle()
        outcomes = Counter(again.status(i)["outcome"] for i in ids)
        assert outcomes == {"executed": 20, "limit_exceeded": 10}
    finally:
        again.gate.close()


def test_a_covered_call_is_decided_in_the_round_that_takes_it(limited: Limited) -> None:
    """The round that takes the proposals asks the usage and takes its answers before it
    commits (``EmbeddedRunner._steps``): one round decides 60 ticket creations under a
    limit of 50, as many rounds as calls no limit covers take."""
    alice = limited.session("alice")
    ids = set(limited.tickets(alice, 60))
    runner = limited.gate.backend.runner  # type: ignore[attr-defined]
    assert runner.try_acquire()
    try:
        runner.run_once()
    finally:
        runner.release()
    decided = {e.invocation_id for e in limited.events(ev.PolicyDecided)}
    running = {e.invocation_id for e in limited.events(ev.ExecutionRequested)}
    refused = [e for e in limited.events(ev.ProposalRejected) if e.invocation_id in ids]
    assert decided == ids
    assert len(running & ids) == 50
    assert len(refused) == 10 and {e.code for e in refused} == {"limit_exceeded"}
