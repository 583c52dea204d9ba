"""An evaluation (AuthZEN, ADR 0083) is decided like a call and runs nothing, on the
embedded backend through the SDK: no dry-run, no execution, no pending approval, no usage
reserved, no key or approval held; its decision is on the log and in the audit."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.helpers import cg
from tests.limits_support import TICKET_LIMIT, limited_profile

from callgate.application.client import Gateway
from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.scope import OPERATOR_ROLE, bound_id

TICKET = {"title": "printer", "requester_id": "alice"}


@pytest.fixture
def limited_app(tmp_path: Path) -> App:
    one_ticket = {**TICKET_LIMIT, "max": 1}
    profile = limited_profile(tmp_path / "profile", one_ticket)
    return bootstrap(Settings(state_dir=tmp_path / "state", dev=True, profile=profile))


@pytest.fixture
def limited_gateway(limited_app: App) -> Iterator[Gateway]:
    gateway = limited_app.gateway()
    try:
        yield gateway
    finally:
        gateway.close()


def session(limited_app: App, user: str = "alice", *roles: str) -> str:
    return limited_app.session_issuer.issue(
        user, "acme", roles or ("support",), limited_app.clock()
    )


def events_of(limited_gateway: Gateway, invocation_id: str) -> list[type[ev.Event]]:
    """The kinds of the invocation's events on the `events` log (requests are not on it)."""
    return [
        type(e) for e in limited_gateway.backend.read_events() if e.invocation_id == invocation_id
    ]


def test_a_permitted_read_is_recorded_and_not_run(
    limited_app: App, limited_gateway: Gateway
) -> None:
    [answer] = limited_gateway.evaluate(
        [(session(limited_app), "tickets.read", {"ticket_id": "T-1"})]
    )
    assert answer["outcome"] == "permitted" and answer["settled"], answer
    assert events_of(limited_gateway, answer["invocation_id"]) == [ev.PolicyDecided]
    assert limited_gateway.effects() == []
    [record] = limited_gateway.audit(answer["invocation_id"], session=session(limited_app))
    assert record["outcome"] == "permitted"
    assert record["authorized_by"]["decision"] == "permit"
    assert record["authorized_by"]["principal"]["user"] == "alice"


def test_a_call_that_needs_a_confirmation_evaluates_to_approval_required_and_nothing_waits(
    limited_app: App, limited_gateway: Gateway
) -> None:
    args = {"record_id": "REC-1", "fields": {"status": "closed"}}
    [answer] = limited_gateway.evaluate([(session(limited_app), "records.update", args)])
    assert answer["outcome"] == "approval_required", answer
    assert "dry_run" not in answer
    assert events_of(limited_gateway, answer["invocation_id"]) == [ev.PolicyDecided]
    assert limited_gateway.pending(session(limited_app, "ops", OPERATOR_ROLE)) == []


def test_refusals_are_the_calls_refusals(limited_app: App, limited_gateway: Gateway) -> None:
    alice = session(limited_app)
    answers = limited_gateway.evaluate(
        [
            (alice, "tickets.read", {"ticket_id": "GT-1"}),  # another tenant's ticket
            (alice, "tickets.create", {**TICKET, "requester_id": "bob"}),  # another user
            (alice, "tickets.nope", {}),
            (alice, "tickets.read", {"ticket_id": ""}),
        ]
    )
    outcomes = [a["outcome"] for a in answers]
    assert outcomes == ["tool_forbidden", "identity_spoof", "unknown_tool", "invalid_arguments"]
    assert len(limited_gateway.audit(session=alice)) == 4


def test_an_evaluation_reserves_no_usage(limited_app: App, limited_gateway: Gateway) -> None:
    """The profile allows one ticket per actor: evaluations never use it up, so the one
    call still fits after them, and a second call is refused as usual."""
    alice = session(limited_app)
    for answer in limited_gateway.evaluate([(alice, "tickets.create", TICKET)] * 3):
        assert answer["outcome"] == "permitted", answer
    assert limited_gateway.propose(alice, "tickets.create", TICKET)["outcome"] == "executed"
    assert limited_gateway.propose(alice, "tickets.create", TICKET)["outcome"] == "limit_exceeded"
    [answer] = limited_gateway.evaluate([(alice, "tickets.create", TICKET)])
    assert answer["outcome"] == "permitted"  # the policy's answer; the limit is C13's


@pytest.mark.parametrize("field", ["idempotency_key", "access_request"])
def test_an_evaluation_with_a_key_or_a_misnamed_access_request_is_malformed(
    limited_app: App, limited_gateway: Gateway, field: str
) -> None:
    """A key is never an evaluation's; an access request's id must say it is one (ADR
    0090). An approval an evaluation presents is an ARAP re-evaluation's (below)."""
    alice = session(limited_app)
    invocation_id = bound_id(alice, uuid.uuid4().hex)
    extra: dict[str, Any] = {field: "k-1" if field == "idempotency_key" else True}
    key = partition_key("acme", extra.get("idempotency_key"), invocation_id)
    proposal = ev.ToolCallProposed(
        event_id=str(uuid.uuid4()),
        invocation_id=invocation_id,
        partition_key=key,
        session_token=alice,
        tool="tickets.read",
        args_json='{"ticket_id": "T-1"}',
        evaluate_only=True,
        **extra,
    )
    status = limited_gateway.backend.follow(proposal, "status", invocation_id, lambda s: True, 10)
    assert status is not None and status["outcome"] == "malformed_event", status
    assert ev.ExecutionRequested not in events_of(limited_gateway, invocation_id)


def test_an_approval_an_evaluation_presents_is_checked_only_where_one_is_needed(
    limited_app: App, limited_gateway: Gateway
) -> None:
    """ADR 0090: without a confirmation to give, a presented approval is ignored (the
    policy permits); where one is needed, a made-up one is ``approval_missing``."""
    alice = session(limited_app)
    made_up = "eyJhbGciOiJFZERTQSJ9.eyJqdGkiOiJhcHItMCJ9.c2ln"
    [read] = limited_gateway.evaluate(
        [(alice, "tickets.read", {"ticket_id": "T-1"})], 10, [made_up]
    )
    assert read["outcome"] == "permitted", read
    refund = {"order_id": "ORD-1", "amount_cents": 25000, "currency": "EUR"}
    [paid] = limited_gateway.evaluate([(alice, "refunds.issue", refund)], 10, [made_up])
    assert paid["outcome"] == "approval_missing", paid


def test_replay_rebuilds_the_views_of_evaluations_equal(tmp_path: Path, limited_app: App) -> None:
    """The status and audit views fold an evaluation's decision the same from the log."""
    limited_gateway = limited_app.gateway()
    try:
        alice = session(limited_app)
        limited_gateway.evaluate([(alice, "tickets.read", {"ticket_id": "T-1"})])
        limited_gateway.evaluate(
            [(alice, "records.update", {"record_id": "REC-1", "fields": {"a": 1}})]
        )
        limited_gateway.evaluate([(alice, "tickets.read", {"ticket_id": "GT-1"})])
    finally:
        limited_gateway.close()
    replayed = cg(tmp_path / "state", "replay", profile=tmp_path / "profile" / "profile.yaml")
    assert replayed["equal"] is True, replayed
