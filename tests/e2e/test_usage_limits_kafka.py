"""Usage limits on Apache Kafka with two ``callgate serve`` instances (ADR 0079).

The proposals of one actor are keyed by their own ids, so they spread over every partition
and both instances; their limit's usage is one key of the ``usage`` process, owned by one
instance at a time. 200 proposals are published at once (as many agents' calls arrive
together), and the limit must hold exactly: the executed calls are the ones that fit, the
sum executed never exceeds the limit, and no reservation is left once all settle.

One deployment serves the module; each test spends the budget of its own actor.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.scope import bound_id
from tests.e2e.test_serve_instances import members
from tests.kafka_support import (
    PARTITIONS,
    Broker,
    Deployment,
    KafkaServe,
    cg,
    token,
    unique_prefix,
    wait_for,
)
from tests.limits_support import REFUND_LIMIT, TICKET_LIMIT, limited_profile, refund

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

N = 200
SETTLE_S = 150.0  # 200 covered calls, each three commits more than an uncovered one
GROUPS = ("usage", "invocations", "status-projection")


@pytest.fixture(scope="module")
def limited_pair(
    kafka_broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """Two instances on one deployment whose profile limits refunds and ticket creations."""
    root = tmp_path_factory.mktemp("limits-kafka")
    profile = limited_profile(root / "profile", REFUND_LIMIT, TICKET_LIMIT)
    dep = Deployment(kafka_broker.bootstrap, unique_prefix("limits"), root / "state", profile)
    a = KafkaServe(dep, root / "a.log", instance_id="a")
    b = KafkaServe(dep, root / "b.log", instance_id="b")
    try:
        a.wait_started()
        b.wait_started()

        def shared() -> bool:
            return all(members(dep, g) == [f"{g}.a", f"{g}.b"] for g in GROUPS)

        wait_for(shared, 90, "both instances to own partitions of every process", poll_s=0.5)
        gate = dep.connect()
        try:  # the whole path answers: a call no limit covers executes
            probe = token(gate, "probe", "acme", "support")
            answer = gate.propose(probe, "tickets.read", {"ticket_id": "T-1"}, timeout_s=60)
            assert answer["outcome"] == "executed", answer
        finally:
            gate.close()
        yield dep
    finally:
        b.stop()
        code = a.stop()
    assert code == 0, a.log.read_text()


def flood(
    dep: Deployment, user: str, tool: str, args: Callable[[int], dict[str, Any]]
) -> tuple[list[str], list[dict[str, Any]]]:
    """Publish ``N`` proposals of ``user`` at once; their ids and settled statuses."""
    gate = dep.connect()
    try:
        session = token(gate, user, "acme", "support")
        ids: list[str] = []
        proposals: list[ev.Event] = []
        for i in range(N):
            inv = bound_id(session, uuid.uuid4().hex)
            ids.append(inv)
            proposals.append(
                ev.ToolCallProposed(
                    event_id=str(uuid.uuid4()),
                    invocation_id=inv,
                    partition_key=partition_key("acme", None, inv),
                    correlation_id=inv,
                    occurred_at=gate.app.clock(),
                    session_token=session,
                    tool=tool,
                    args_json=json.dumps(args(i)),
                )
            )
        started = time.monotonic()
        gate.backend.publish(proposals)

        def settled() -> bool:
            return all((s := gate.backend.view("status", i)) and s.get("settled") for i in ids)

        assert gate.backend.wait(settled, SETTLE_S), "not every call settled"
        print(f"\n{N} {tool} settled in {time.monotonic() - started:.1f}s")
        statuses = [gate.backend.view("status", i) or {} for i in ids]
        return ids, statuses
    finally:
        gate.close()


def held(dep: Deployment) -> int:
    """Reservations on the log neither committed nor released."""
    events = [e for _, e in dep.events()]
    reserved = {e.reservation_id for e in events if isinstance(e, ev.UsageReserved)}
    done = {e.reservation_id for e in events if isinstance(e, ev.UsageCommitted | ev.UsageReleased)}
    return len(reserved - done)


def effects_of(dep: Deployment, ids: list[str]) -> list[dict[str, Any]]:
    gate = dep.connect()
    try:
        mine = set(ids)
        return [e for e in gate.effects() if e["invocation_id"] in mine]
    finally:
        gate.close()


def test_200_concurrent_refunds_on_two_instances_execute_exactly_10(
    limited_pair: Deployment,
) -> None:
    ids, statuses = flood(limited_pair, "rita", "refunds.issue", refund)
    outcomes = Counter(s["outcome"] for s in statuses)
    print("outcomes:", dict(outcomes))
    assert outcomes == {"executed": 10, "limit_exceeded": 190}
    refused = [s for s in statuses if s["outcome"] == "limit_exceeded"]
    for status in refused:
        details = status["error"]["details"]
        assert details["limit"] == "refunds-per-actor" and details["window"] == "24h"
        assert details["max"] == 100_000 and details["amount"] == 9_999
        assert details["used"] + 9_999 > 100_000  # refused only where it did not fit
        assert isinstance(details["retry_after_s"], int) and details["retry_after_s"] >= 1
    effects = effects_of(limited_pair, ids)
    spent = sum(e["args"]["amount_cents"] for e in effects)
    print(f"effects: {len(effects)}, executed sum: {spent} of 100000")
    assert len(effects) == 10 and spent <= 100_000
    assert held(limited_pair) == 0
    # The premise: one actor's calls sat on every partition, their usage on one.
    mine = set(ids)
    asked = [(r.partition, e) for r, e in limited_pair.events() if e.invocation_id in mine]
    calls = {p for p, e in asked if isinstance(e, ev.ToolCallProposed | ev.PolicyDecided)}
    scope = {p for p, e in asked if isinstance(e, ev.UsageReserveRequested)}
    assert len(calls) == PARTITIONS and len(scope) == 1, (calls, scope)


def test_200_concurrent_ticket_creations_on_two_instances_execute_exactly_50(
    limited_pair: Deployment,
) -> None:
    ids, statuses = flood(
        limited_pair, "tom", "tickets.create", lambda i: {"title": f"t{i}", "requester_id": "tom"}
    )
    outcomes = Counter(s["outcome"] for s in statuses)
    print("outcomes:", dict(outcomes))
    assert outcomes == {"executed": 50, "limit_exceeded": 150}
    assert len(effects_of(limited_pair, ids)) == 50
    assert held(limited_pair) == 0
    gate = limited_pair.connect()
    try:  # the usage view, folded on Kafka, shows what the usage process counted
        reader = token(gate, "tom", "acme", "support")

        def counted() -> bool:
            rows = gate.usage(reader, "tickets-per-actor")
            return [(r["scope"], r["used"], r["held"]) for r in rows] == [
                ({"tenant": "acme", "actor": "tom"}, 50, 0)
            ]

        assert gate.backend.wait(counted, 30), gate.usage(reader)
    finally:
        gate.close()
    replayed = cg(limited_pair, "replay")
    print("replay:", {k: v["equal"] for k, v in replayed["views"].items()})
    assert replayed["equal"] is True and replayed["views"]["usage"]["live"] >= 2
