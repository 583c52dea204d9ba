"""``policy simulate`` with a candidate's limits: the replay of the recorded history in order
(``callgate.domain.simulated_usage``), against a model written here from the rules of
ADR 0079 alone: a call fits when what ran plus what is held plus its amount stays within
the limit; a refused call holds nothing; a hold ends as the history ended the call."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.limits_support import limited_profile

from callgate.adapters.profiles import load_profile
from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json
from callgate.domain.catalog import Profile
from callgate.domain.simulated_usage import (
    ENDED,
    LIMIT_EXCEEDED,
    RAN,
    REFUSED,
    REPLAYED,
    recorded_ends,
    replay,
)
from callgate.domain.simulation import Simulator
from callgate.domain.usage import bucket_ms, window_ms

T0 = 1_800_000_000_000
MAX = 30_000  # cents per actor per day
DAY = window_ms("24h")
LIMIT = {
    "name": "refunds-per-actor",
    "tools": ["refunds.issue"],
    "count": "sum",
    "arg": "amount_cents",
    "max": MAX,
    "window": "24h",
    "per": ["actor"],
}


@pytest.fixture(scope="module")
def candidate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Profile]:
    yield load_profile(limited_profile(tmp_path_factory.mktemp("candidate"), LIMIT))


def decided(n: int, actor: str, amount: int, at: int | None = None) -> ev.PolicyDecided:
    """A recorded permit of a refund below the approval threshold (no confirmation)."""
    args = {"order_id": f"ORD-{n}", "amount_cents": amount, "currency": "EUR", "issued_by": actor}
    return ev.PolicyDecided(
        event_id=f"decided-{n}",
        invocation_id=f"inv-{n}",
        partition_key=f"p-{n}",
        causation_id=f"step-{n}",
        occurred_at=T0 + n if at is None else at,
        actor=actor,
        tenant="acme",
        roles=("support",),
        tool="refunds.issue",
        target=f"ORD-{n}",
        args_json=canonical_json(args),
        args_hash="",
        fingerprint="",
        idempotency_key=None,
        policy_version="recorded",
        decision="permit",
        determining_policies=(),
        mutation=True,
        high_impact=False,
        confirmation="none",
        resource_json=canonical_json({"source": "profile", "tenant": "acme", "attributes": {}}),
    )


# What each event class needs besides its envelope, for ``ended``.
REQUIRED: dict[type[ev.Event], dict[str, Any]] = {
    ev.ExecutionSucceeded: {"execution_token": "t", "result_json": "{}"},
    ev.ExecutionFailed: {"execution_token": "t", "message": "down"},
    ev.ProposalRejected: {"code": "limit_exceeded", "message": "over"},
    ev.ReplayServed: {"original_invocation_id": "o", "original_outcome": "executed",
                      "result_json": "{}"},
    ev.ApprovalGranted: {"approval_id": "a", "approval_jti": "j", "approver": "f",
                         "expires_at": 0},
}  # fmt: skip


def ended(cls: type[ev.Event], n: int, at: int, step: str | None = None, **fields: Any) -> ev.Event:
    """An event of invocation ``n``: in its deciding step when ``step`` is its own."""
    defaults = REQUIRED[cls]
    return cls(
        event_id=f"{cls.__name__}-{n}",
        invocation_id=f"inv-{n}",
        partition_key=f"p-{n}",
        causation_id=step or f"later-{n}",
        occurred_at=at,
        **{**defaults, **fields},
    )


# --- how the recorded history ended each call ------------------------------------------


@pytest.mark.parametrize(
    ("then", "how"),
    [
        (ended(ev.ExecutionSucceeded, 1, T0 + 5), RAN),
        (ended(ev.ExecutionFailed, 1, T0 + 5), ENDED),
        (ended(ev.ReplayServed, 1, T0 + 1, step="step-1"), REPLAYED),
        (ended(ev.ProposalRejected, 1, T0 + 1, step="step-1"), LIMIT_EXCEEDED),
        (ended(ev.ProposalRejected, 1, T0 + 1, step="step-1", code="approval_missing"), REFUSED),
        (ended(ev.ProposalRejected, 1, T0 + 9, code="approval_mismatch"), ENDED),
        (ended(ev.ApprovalGranted, 1, T0 + 9), ENDED),  # no continuation: a new call runs
    ],
)
def test_how_the_history_ended_a_call(then: ev.Event, how: str) -> None:
    # given a decision, when this event follows, then the call's hold ended so, there
    fates = recorded_ends([decided(1, "alice", 100), then])
    assert fates.ends["inv-1"].how == how
    assert fates.ends["inv-1"].index == 1 and fates.ends["inv-1"].at_ms == then.occurred_at


def test_a_granted_call_that_continues_ends_when_it_runs() -> None:
    requested = ev.ExecutionRequested(
        event_id="x", invocation_id="inv-1", partition_key="p-1", occurred_at=T0 + 3,
        tenant="acme", tool="refunds.issue", target="ORD-1", args_json="{}",
        execution_token="t",
    )  # fmt: skip
    history = [
        decided(1, "alice", 100),
        ended(ev.ApprovalGranted, 1, T0 + 2),
        requested,
        ended(ev.ExecutionSucceeded, 1, T0 + 4),
    ]
    assert recorded_ends(history).ends["inv-1"].how == RAN


def test_a_recorded_denial_ends_at_its_decision() -> None:
    denied = dataclasses.replace(decided(1, "alice", 100), decision="deny")
    assert recorded_ends([denied]).ends["inv-1"].how == ENDED


# --- the replay against the model -------------------------------------------------------


@dataclass(frozen=True)
class Call:
    actor: str
    amount: int
    fate: str  # "ran", "failed" or "pending"
    delay: int  # calls decided before its fate is recorded


calls = st.lists(
    st.builds(
        Call,
        actor=st.sampled_from(["alice", "Alice", "bob"]),
        amount=st.integers(1, 9_999),
        fate=st.sampled_from(["ran", "ran", "failed", "pending"]),
        delay=st.integers(0, 4),
    ),
    max_size=40,
)


def history_of(plan: list[Call]) -> list[ev.Event]:
    """Each call decided in turn, its recorded fate ``delay`` decisions later."""
    slots: list[list[ev.Event]] = [[] for _ in range(len(plan) + 5)]
    for n, call in enumerate(plan):
        slots[n].append(decided(n, call.actor, call.amount))
        if call.fate != "pending":
            kind = ev.ExecutionSucceeded if call.fate == "ran" else ev.ExecutionFailed
            slots[n + call.delay].append(ended(kind, n, T0 + n + call.delay))
    return [e for slot in slots for e in slot]


def model(history: list[ev.Event], plan: list[Call]) -> dict[str, int]:
    """The refused calls (invocation id -> the usage before them), from ADR 0079's rules."""
    ran: dict[str, int] = {}
    held: dict[str, int] = {}
    refused: dict[str, int] = {}
    for e in history:
        n = int(e.invocation_id.removeprefix("inv-"))
        call = plan[n]
        if isinstance(e, ev.PolicyDecided):
            used = ran.get(call.actor, 0) + sum(
                plan[int(i.removeprefix("inv-"))].amount
                for i in held
                if plan[int(i.removeprefix("inv-"))].actor == call.actor
            )
            if used + call.amount > MAX:
                refused[e.invocation_id] = used
            else:
                held[e.invocation_id] = call.amount
        elif e.invocation_id in held:
            amount = held.pop(e.invocation_id)
            if isinstance(e, ev.ExecutionSucceeded):
                ran[call.actor] = ran.get(call.actor, 0) + amount
    return refused


@settings(max_examples=150, deadline=None)
@given(plan=calls)
def test_the_replay_refuses_what_the_model_refuses(candidate: Profile, plan: list[Call]) -> None:
    history = history_of(plan)
    decided_n, changes, refusals = replay(Simulator(candidate), history)
    expected = model(history, plan)
    assert decided_n == len(plan)
    assert {r.invocation_id: r.details["used"] for r in refusals} == expected
    assert [r.invocation_id for r in refusals] == sorted(expected, key=lambda i: int(i[4:]))
    assert {c.invocation_id for c in changes} == set(expected)
    assert all(c.transition == "executed → limit_exceeded" for c in changes)
    for r in refusals:
        assert r.details["limit"] == "refunds-per-actor" and r.details["max"] == MAX
        assert r.details["amount"] == plan[int(r.invocation_id[4:])].amount


def test_what_ran_leaves_the_window_a_day_and_a_bucket_later(candidate: Profile) -> None:
    """Three refunds of 10,000 fill the day; a fourth an hour later is refused with the
    time until the first leaves; one a window and a bucket after the first fits."""
    history: list[ev.Event] = []
    for n in range(3):
        history += [decided(n, "alice", 10_000), ended(ev.ExecutionSucceeded, n, T0 + n)]
    history.append(decided(3, "alice", 10_000, at=T0 + 3_600_000))
    history.append(decided(4, "alice", 10_000, at=T0 + DAY + bucket_ms(DAY)))
    _, _, refusals = replay(Simulator(candidate), history)
    assert [r.invocation_id for r in refusals] == ["inv-3"]
    details = refusals[0].details
    assert details["used"] == 30_000 and details["window"] == "24h"
    assert details["retry_after_s"] == (DAY + bucket_ms(DAY) - 3_600_000) // 1000


def test_replays_and_calls_refused_before_the_limits_count_nothing(candidate: Profile) -> None:
    history: list[ev.Event] = [decided(n, "alice", 10_000) for n in range(3)]
    history += [ended(ev.ExecutionSucceeded, n, T0 + 10) for n in range(2)]
    # A replay of the first and a call its approval check refused: each over the limit
    # if it counted, neither does, and neither is reported.
    history += [decided(5, "alice", 10_000), ended(ev.ReplayServed, 5, T0 + 5, step="step-5")]
    history += [
        decided(6, "alice", 10_000),
        ended(ev.ProposalRejected, 6, T0 + 6, step="step-6", code="approval_missing"),
    ]
    history.append(decided(7, "alice", 10_000))  # the fourth that counts: refused
    _, _, refusals = replay(Simulator(candidate), history)
    assert [r.invocation_id for r in refusals] == ["inv-7"]


def test_the_tenant_and_since_filters_report_less_and_count_everything(
    candidate: Profile,
) -> None:
    history: list[ev.Event] = []
    for n in range(4):
        history += [decided(n, "alice", 10_000), ended(ev.ExecutionSucceeded, n, T0 + n)]
    everything = replay(Simulator(candidate), history)
    recent = replay(Simulator(candidate), history, since_ms=T0 + 3)
    other = replay(Simulator(candidate), history, tenant="globex")
    assert [r.invocation_id for r in everything[2]] == ["inv-3"]
    assert recent[0] == 1 and [r.invocation_id for r in recent[2]] == ["inv-3"]
    assert other[0] == 0 and other[2] == []


def test_an_operators_raise_recorded_applies_to_the_same_limit(candidate: Profile) -> None:
    history: list[ev.Event] = []
    for n in range(3):
        history += [decided(n, "alice", 10_000), ended(ev.ExecutionSucceeded, n, T0 + n)]
    [limit] = candidate.limits
    key = limit.scope_key("acme", "alice", "", "refunds.issue")
    history.append(
        ev.UsageLimitChanged(
            event_id="raise", invocation_id="", partition_key=key, occurred_at=T0 + 5,
            limit=limit.name, scope_json="{}", action="raise", raise_by=10_000,
            reason="month end", author="olga", tenant="ops",
        )
    )  # fmt: skip
    history += [decided(6, "alice", 10_000), decided(7, "alice", 10_000)]
    _, _, refusals = replay(Simulator(candidate), history)
    assert [r.invocation_id for r in refusals] == ["inv-7"]
    assert refusals[0].details["max"] == 40_000
