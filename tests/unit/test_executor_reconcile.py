"""C12: an uncertain outcome is reconciled with the provider before any retry.

Timeouts come from the simulated providers' fault injection (a timeout after the effect
was applied, or before it); crashes from the in-memory runner, which can kill the
executor between committing ``ExecutionStarted`` and committing the outcome. The
simulated providers do not deduplicate by token, so a second execute would show up as a
second row in the effect ledger: every test ends by counting effects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.harness import Gate

from callgate.adapters.memory import CrashMode
from callgate.domain import events as ev
from callgate.domain.canonical import derive_id

TICKET: dict[str, Any] = {"title": "Printer on fire", "requester_id": "alice"}
REFUND: dict[str, Any] = {"order_id": "ORD-1", "amount_cents": 500, "currency": "USD"}


def faulty(tmp_path: Path, provider: str, fault: str) -> Gate:
    """A gate whose ``provider`` suffers ``fault`` on its first execute only."""
    g = Gate(tmp_path / "state", faults={provider: {fault: 1.0, "first_n": 1}})
    g.record_provider_calls()
    return g


def first_attempt(g: Gate, tool: str, args: dict[str, Any]) -> tuple[str, str, str | None]:
    """Propose (confirming first when the tool needs it); return (token, invocation, approval)."""
    alice = g.session("alice")
    if tool == "refunds.issue":
        pending = g.propose(alice, tool, args, key="K")
        approval = g.approve(alice, pending)
        return alice, g.propose(alice, tool, args, key="K", approval_id=approval), approval
    return alice, g.propose(alice, tool, args, key="K"), None


def positions(g: Gate, cls: type[ev.Event]) -> list[int]:
    return [i for i, e in enumerate(g.runner.log.events) if isinstance(e, cls)]


def execute_token(g: Gate) -> str:
    (requested, *_) = g.events(ev.ExecutionRequested)
    return requested.execution_token


@pytest.mark.parametrize(
    ("provider", "tool", "args"),
    [("tickets", "tickets.create", TICKET), ("refunds", "refunds.issue", REFUND)],
    ids=["tickets.create", "refunds.issue-approved"],
)
def test_timeout_after_apply_is_reconciled_and_replays_the_real_result(
    tmp_path: Path, provider: str, tool: str, args: dict[str, Any]
) -> None:
    """C12: the provider applied the effect, then timed out: the call is outcome_uncertain;
    the next attempt with the same key and fingerprint reconciles via lookup first and
    replays the real result; exactly one effect."""
    # given an execution that timed out after the provider applied it
    g = faulty(tmp_path, provider, "timeout_after_apply")
    alice, first, approval = first_attempt(g, tool, args)
    assert g.outcome(first) == "outcome_uncertain"
    (effect,) = g.effects()
    token = execute_token(g)
    assert effect["token"] == token
    # when the caller retries with the same key and the same arguments
    retry = g.propose(alice, tool, args, key="K", approval_id=approval)
    # then the provider was asked what happened before anything else, and not executed again
    assert [c for c in g.calls if c[0] != "dry_run"] == [("execute", token), ("lookup", token)]
    (asked,) = positions(g, ev.ReconciliationRequested)
    (answered,) = positions(g, ev.ExecutionReconciled)
    assert asked < answered
    assert len(positions(g, ev.ExecutionRequested)) == 1
    # and the retry gets the real result, recorded as the original's outcome too
    assert g.outcome(retry) == "replayed"
    assert g.status(retry)["result"] == effect["result"]
    assert g.outcome(first) == "executed"
    assert g.status(first)["result"] == effect["result"]
    # a further retry replays without asking the provider again
    calls = len(g.calls)
    assert g.outcome(g.propose(alice, tool, args, key="K", approval_id=approval)) == "replayed"
    assert len(g.calls) == calls
    assert len(g.effects()) == 1


def test_timeout_before_apply_is_reconciled_then_executed_once_with_the_same_token(
    tmp_path: Path,
) -> None:
    """C12: the provider timed out before applying: reconciliation finds nothing, and the
    retry executes exactly once, with the original idempotency token."""
    g = faulty(tmp_path, "tickets", "timeout_before_apply")
    alice, first, _ = first_attempt(g, "tickets.create", TICKET)
    assert g.outcome(first) == "outcome_uncertain"
    assert g.effects() == []
    token = execute_token(g)
    retry = g.propose(alice, "tickets.create", TICKET, key="K")
    assert g.calls == [("execute", token), ("lookup", token), ("execute", token)]
    (reconciled,) = g.events(ev.ExecutionReconciled)
    assert reconciled.found is False
    (answered,) = positions(g, ev.ExecutionReconciled)
    assert answered < positions(g, ev.ExecutionRequested)[1]
    assert g.outcome(retry) == "executed"
    (effect,) = g.effects()
    assert (effect["token"], effect["invocation_id"]) == (token, retry)
    again = g.propose(alice, "tickets.create", TICKET, key="K")
    assert g.outcome(again) == "replayed"
    assert g.status(again)["result"] == effect["result"]
    assert len(g.effects()) == 1


def test_a_changed_fingerprint_after_a_timeout_is_a_conflict_not_a_retry(tmp_path: Path) -> None:
    """C8, C12: only the same key with an unchanged fingerprint may retry; a changed
    request is idempotency_conflict, with no reconciliation and no execution."""
    g = faulty(tmp_path, "tickets", "timeout_before_apply")
    alice, first, _ = first_attempt(g, "tickets.create", TICKET)
    changed = g.propose(alice, "tickets.create", {**TICKET, "title": "Other"}, key="K")
    assert g.outcome(changed) == "idempotency_conflict"
    assert g.events(ev.ReconciliationRequested) == []
    assert [c[0] for c in g.calls] == ["execute"]
    assert g.outcome(first) == "outcome_uncertain"
    assert g.effects() == []


@pytest.mark.parametrize("key", ["K", None], ids=["with-key", "without-key"])
def test_crash_before_the_provider_call_is_reconciled_before_new_work(
    tmp_path: Path, key: str | None
) -> None:
    """C12: the executor died after committing ExecutionStarted, before calling the
    provider. On restart it reconciles first (lookup before any other provider call),
    finds nothing, and the call then executes once with the same token."""
    g = Gate(tmp_path / "state")
    g.record_provider_calls()
    alice = g.session("alice")
    g.runner.crash_next_follow_up("invocations", "before", ev.ExecutionStarted)
    first = g.propose(alice, "tickets.create", TICKET, key=key)
    assert g.outcome(first) == "allowed"  # in flight: nobody knows yet
    token = execute_token(g)
    assert g.calls == [] and g.effects() == []
    # new work arrives while the executor is down
    other = g.propose(alice, "tickets.create", {**TICKET, "title": "Another"})
    # when it restarts
    g.runner.restart()
    # then it reconciled the open execution before doing anything else
    assert g.calls[0] == ("lookup", token)
    assert g.calls.count(("execute", token)) == 1
    assert g.calls.index(("execute", token)) > 0
    assert [g.outcome(first), g.outcome(other)] == ["executed", "executed"]
    assert sorted(e["invocation_id"] for e in g.effects()) == sorted([first, other])
    assert [e["token"] for e in g.effects()].count(token) == 1


def test_crash_after_the_provider_call_recovers_the_real_result(tmp_path: Path) -> None:
    """C12: the executor died after the provider applied the effect, before committing the
    outcome. On restart the lookup finds the effect: executed with its real result, and
    never a second execute."""
    g = Gate(tmp_path / "state")
    g.record_provider_calls()
    alice = g.session("alice")
    g.runner.crash_next_follow_up("invocations", "after", ev.ExecutionStarted)
    first = g.propose(alice, "tickets.create", TICKET, key="K")
    token = execute_token(g)
    (effect,) = g.effects()
    assert g.outcome(first) == "allowed"
    g.runner.restart()
    assert g.calls == [("execute", token), ("lookup", token)]
    assert g.outcome(first) == "executed"
    assert g.status(first)["result"] == effect["result"]
    assert len(g.effects()) == 1
    # The recovery's outcome names the execution it settles as its cause.
    (started,) = g.events(ev.ExecutionStarted)
    (reconciled,) = g.events(ev.ExecutionReconciled)
    assert reconciled.causation_id == started.event_id
    assert reconciled.event_id == derive_id(started.event_id, "ExecutionReconciled")


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_retry_during_the_outage_waits_and_gets_the_one_result(
    tmp_path: Path, mode: CrashMode
) -> None:
    """C8, C12: a client retry with the same key while the process is down waits (nothing
    decides it meanwhile) and does not start a second execution; after recovery it is
    served the one result."""
    g = Gate(tmp_path / "state")
    alice = g.session("alice")
    g.runner.crash_next_follow_up("invocations", mode, ev.ExecutionStarted)
    first = g.propose(alice, "tickets.create", TICKET, key="K")
    retry = g.propose(alice, "tickets.create", TICKET, key="K")
    assert retry not in g.runner.log.views.get("status", {})  # its request waits
    g.runner.restart()
    (effect,) = g.effects()
    assert g.outcome(first) == "executed"
    assert g.outcome(retry) == "replayed"
    assert g.status(retry)["result"] == effect["result"]


def test_repeated_crashes_still_give_one_effect(tmp_path: Path) -> None:
    """C12: crashing again while recovering the same call never doubles the effect."""
    g = Gate(tmp_path / "state")
    alice = g.session("alice")
    g.runner.crash_next_follow_up("invocations", "before", ev.ExecutionStarted)
    first = g.propose(alice, "tickets.create", TICKET, key="K")
    g.runner.crash_next_follow_up("invocations", "after", ev.ExecutionStarted)
    g.runner.restart()  # lookup finds nothing; the retry applies the effect, then crashes
    assert len(g.effects()) == 1
    g.runner.restart()  # lookup finds it
    assert g.outcome(first) == "executed"
    assert len(g.effects()) == 1


@pytest.mark.parametrize("key", ["K", None], ids=["with-key", "without-key"])
def test_a_duplicated_reconciliation_does_not_execute_again(
    tmp_path: Path, key: str | None
) -> None:
    """C12 under at-least-once delivery: the same ExecutionReconciled(found=False)
    delivered twice (at-least-once delivery: ``adapters.memory.Chaos``)
    authorizes one retry, not two."""
    g = Gate(tmp_path / "state")
    alice = g.session("alice")
    g.runner.crash_next_follow_up("invocations", "before", ev.ExecutionStarted)
    first = g.propose(alice, "tickets.create", TICKET, key=key)
    g.runner.restart()
    assert g.outcome(first) == "executed"
    (reconciled,) = g.events(ev.ExecutionReconciled)
    g.runner.publish(reconciled)  # the same event again
    g.runner.run()
    assert len(g.effects()) == 1
    assert g.outcome(first) == "executed"


def test_an_uncertain_outcome_proves_its_attempt_started_when_started_was_seen_first(
    tmp_path: Path,
) -> None:
    """C12: the decider reads ``requests`` and ``events``, which are not ordered with each
    other. When the executor's ``ExecutionStarted`` reaches a restarted decider before the
    proposal it re-decides (its two input topics are not ordered with each other), the
    later ``ExecutionUncertain`` still proves that attempt started: a retry that reconciles
    and finds nothing executes once instead of waiting forever."""
    # given the log of: a create that timed out before applying, then a retry that
    # reconciled (nothing found) and executed once with the same token
    g = faulty(tmp_path, "tickets", "timeout_before_apply")
    alice, first, _ = first_attempt(g, "tickets.create", TICKET)
    retry = g.propose(alice, "tickets.create", TICKET, key="K")
    assert g.outcome(retry) == "executed"
    log = g.events()
    expected = [e for e in log if isinstance(e, ev.ExecutionRequested)]
    # when a fresh decider reads the first ExecutionStarted before the first proposal
    (started, *_) = [e for e in log if isinstance(e, ev.ExecutionStarted)]
    (proposal, *_) = [e for e in log if isinstance(e, ev.ToolCallProposed)]
    reordered = [started] + [e for e in log if e is not started]
    decider = g.app.decider()
    state = decider.initial_state()
    requested: list[ev.ExecutionRequested] = []
    for event in reordered:
        state, outputs = decider.handle(state, event, g.runner.now_ms)
        requested += [o for o in outputs if isinstance(o, ev.ExecutionRequested)]
    # then it still asks for the retry's one execution, exactly as the ordered run did
    assert proposal.invocation_id == first
    assert [(r.invocation_id, r.attempt) for r in requested] == [
        (r.invocation_id, r.attempt) for r in expected
    ]
    assert requested[-1].invocation_id == retry
