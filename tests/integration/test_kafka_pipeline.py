"""The whole service on the Kafka backend, through the Python SDK, against a real broker.

One ``callgate serve`` (the supervisor and its six worker processes) runs for this module
on the suite's Apache Kafka broker under a topic prefix of its own
(``tests.kafka_support``); the SDK publishes to ``requests`` and reads the compacted view
topics, exactly as an agent platform and an approval UI would. Nothing Kafka is mocked.

serve's children get a 6 s session timeout, so a SIGKILLed child's partitions move soon.
Every event id is deterministic (derived from the causing event); ``test_sigkill_*`` proves
that any id seen twice on ``events`` would be a byte-identical copy (same decision), never a
second decision (``read_committed`` hides aborted transactions, so none is expected).
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any

import pytest
from tests.e2e.helpers import Planned, make_plan
from tests.harness import write_profile
from tests.kafka_support import (
    CODEC,
    PARTITIONS,
    REFUND,
    Broker,
    Deployment,
    DeploymentSpec,
    KafkaServe,
    committed_offsets,
    lifecycle_scenario,
    operator,
    token,
    v1_scenario,
    v2_scenario,
    wait_for,
)

from callgate.adapters.kafka.client import make_producer, publish
from callgate.adapters.kafka.state import HEADER_TXN, read_committed_changelog
from callgate.application.replay import replay
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.scope import bound_id
from callgate.surfaces.sdk import Gateway
from callgate_projections.audit import verify_chain

pytestmark = pytest.mark.kafka

DECISIONS = {"PolicyDecided", "ProposalRejected"}
# Events that happen at most once per invocation, however often the decider restarts.
ONCE = (*DECISIONS, "ApprovalRequested", "DryRunRequested", "ExecutionSucceeded", "ReplayServed")


# The agent resubmits after an approval here (C4, C8, C11, V2: ADR 0029).
KAFKA_DEPLOYMENT = DeploymentSpec("pipeline", profile=lambda root: write_profile(root / "profile"))


def test_lifecycle_read_approve_confirm_replay(
    kafka_deployment: Deployment, kafka_gateway: Gateway
) -> None:
    """C2, C4, C5, C8, C9, C11 (``lifecycle_scenario``)."""
    lifecycle_scenario(kafka_deployment, kafka_gateway)


def test_v1_model_supplied_requester_is_identity_spoof(
    kafka_deployment: Deployment, kafka_gateway: Gateway
) -> None:
    """V1 / C6 (``v1_scenario``)."""
    v1_scenario(kafka_deployment, kafka_gateway)


def test_v2_swapped_arguments_are_approval_mismatch_and_one_effect(
    kafka_deployment: Deployment, kafka_gateway: Gateway
) -> None:
    """V2 / C8, C11 (``v2_scenario``)."""
    v2_scenario(kafka_deployment, kafka_gateway)


# --- poison --------------------------------------------------------------------------------------


def test_poison_is_dead_lettered_and_later_proposals_are_decided(
    kafka_deployment: Deployment, kafka_gateway: Gateway
) -> None:
    """``malformed_event``: random bytes, and a service event (``ExecutionRequested``)
    injected through ``requests``, are dead-lettered with reason and original bytes; no
    provider runs it; proposals after them on every partition are still decided."""
    requests = kafka_deployment.topics.physical("requests")
    garbage = random.Random(3).randbytes(64)
    forged = ev.ExecutionRequested(
        event_id=f"forged-{uuid.uuid4()}", invocation_id=f"forged-{uuid.uuid4()}",
        partition_key="i-forged", tenant="acme", tool="tickets.create", target="new",
        args_json='{"title": "forged", "requester_id": "alice"}', execution_token="xi-forged",
    )  # fmt: skip
    forged_bytes = CODEC.encode(forged)
    sent: dict[tuple[int, int], bytes] = {}  # (partition, offset) -> bytes

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        sent[(msg.partition(), msg.offset())] = msg.value()

    producer = make_producer(kafka_deployment.bootstrap)
    for p in range(PARTITIONS):  # poison at the head of every partition
        producer.produce(requests, key=b"poison", value=garbage, partition=p, on_delivery=delivered)
        producer.produce(
            requests, key=forged.partition_key.encode(), value=forged_bytes, partition=p,
            on_delivery=delivered,
        )  # fmt: skip
    assert producer.flush(30) == 0 and len(sent) == 2 * PARTITIONS
    before = kafka_gateway.effects()

    # Later proposals, until every partition has one behind its poison.
    alice = token(kafka_gateway, "alice", "acme", "support")
    later: dict[str, int] = {}
    while len(set(later.values())) < PARTITIONS and len(later) < 60:
        inv = bound_id(alice, uuid.uuid4().hex)  # as the SDK binds it (domain/scope.py)
        proposal = ev.ToolCallProposed(
            event_id=f"evt-{inv}", invocation_id=inv, partition_key=partition_key("", None, inv),
            occurred_at=kafka_gateway.app.clock(), producer="test", session_token=alice,
            tool="tickets.read", args_json='{"ticket_id": "T-5"}',
        )  # fmt: skip
        [(_, partition, _)] = publish(producer, CODEC, kafka_deployment.topics, [proposal])
        later[inv] = partition
    assert set(later.values()) == set(range(PARTITIONS))

    def settled() -> bool:
        gate = kafka_gateway
        return all((gate.status(inv, operator(gate)) or {}).get("settled") for inv in later)

    assert kafka_gateway.backend.wait(settled, 60), "proposals behind the poison were not decided"
    assert {kafka_gateway.answer(inv)["outcome"] for inv in later} == {"executed"}

    letters = [
        e for _, e in kafka_deployment.events("dead-letter") if isinstance(e, ev.EventDeadLettered)
    ]
    by_source = {(d.source_partition, d.source_offset): d for d in letters}
    for where, raw in sent.items():
        letter = by_source.get(where)
        assert letter is not None, f"poison at {where} was not dead-lettered"
        assert letter.code == "malformed_event" and letter.source_topic == "requests"
        assert letter.original == raw
        if raw == garbage:
            assert "marker" in letter.reason, letter.reason
        else:
            assert "ExecutionRequested does not belong on topic requests" in letter.reason
    assert kafka_gateway.effects() == before  # the forged execution never reached a provider
    assert kafka_gateway.status(forged.invocation_id, operator(kafka_gateway)) is None


# --- kill -9 of the decider mid-stream ---------------------------------------------------------


def decider_positions(kafka_deployment: Deployment) -> dict[int, int]:
    """The decider's committed offsets on ``requests``, per partition."""
    group, requests = (
        kafka_deployment.topics.group("invocations"),
        kafka_deployment.topics.physical("requests"),
    )
    return committed_offsets(kafka_deployment.bootstrap, group, requests, PARTITIONS)


class Stream:
    """Publishes slices of the plan, never waiting for decisions; tracks the log ends."""

    def __init__(
        self, kafka_deployment: Deployment, kafka_gateway: Gateway, plan: list[Planned]
    ) -> None:
        self.producer = make_producer(kafka_deployment.bootstrap)
        self.topics = kafka_deployment.topics
        self.clock = kafka_gateway.app.clock
        self.plan = plan
        self.sent = 0
        self.ends: dict[int, int] = {}  # partition -> one past the last published offset

    def publish(self, n: int) -> None:
        now = self.clock()
        batch = [p.proposal(now, "kill-test") for p in self.plan[self.sent : self.sent + n]]
        for _, partition, offset in publish(self.producer, CODEC, self.topics, batch):
            self.ends[partition] = max(self.ends.get(partition, 0), offset + 1)
        self.sent += len(batch)


def test_sigkill_the_decider_mid_stream_settles_everything_exactly_once(
    kafka_deployment: Deployment,
    kafka_serve: KafkaServe,
    kafka_gateway: Gateway,
    kafka_broker: Broker,
) -> None:
    """SIGKILL the decider child three times while 540 proposals flow; serve's supervisor
    restarts it, the new child fences
    the dead one's transaction and restores its state from the changelog. C8, C9, C12: every
    proposal settles once with the outcome it would have had anyway, every ticket exists
    exactly once, no invocation is decided twice."""
    rng = random.Random(0xDEC1DE)
    alice = token(kafka_gateway, "alice", "acme", "support")
    gina = token(kafka_gateway, "gina", "globex", "support")
    tag = f"kill-{uuid.uuid4().hex[:6]}"
    plan = make_plan(rng, alice, gina, 540, tag, keyed_deploys=True)
    ids = {p.invocation_id for p in plan}
    by_id = {p.invocation_id: p for p in plan}
    effects_before = {e["seq"] for e in kafka_gateway.effects()}

    # Per kill: a few proposals until the (restarted) decider commits again, then a burst,
    # and the kill lands a random moment later, while the burst is being decided. What
    # is left flows in while the last replacement is still joining its group.
    stream = Stream(kafka_deployment, kafka_gateway, plan)
    kills: list[tuple[dict[int, int], dict[int, int]]] = []  # (committed, published)
    for _ in range(3):
        before = decider_positions(kafka_deployment)
        deadline, trickled = time.monotonic() + 120, 0
        while decider_positions(kafka_deployment) == before:
            assert time.monotonic() < deadline, (
                f"the decider made no progress in 120 s after {len(kills)} kill(s); "
                f"serve's log ends:\n{kafka_serve.log.read_text()[-4000:]}"
            )
            if trickled < 30:
                stream.publish(1)
                trickled += 1
            time.sleep(0.4)
        stream.publish(150)
        time.sleep(rng.uniform(0.0, 0.1))  # the decider commits such a burst after 0.1-0.2 s
        published = dict(stream.ends)
        kafka_serve.kill_worker("invocations")
        kills.append((decider_positions(kafka_deployment), published))
    stream.publish(len(plan))
    assert stream.sent == len(plan)

    def settled() -> int:
        rows = kafka_gateway.backend.view_items("status")
        return sum(bool(value.get("settled")) for key, value in rows if key in ids)

    try:
        wait_for(lambda: settled() == len(ids), 120, f"all {len(ids)} proposals to settle", 0.5)
    except AssertionError:
        raise AssertionError(unsettled_report(kafka_deployment, kafka_gateway, plan)) from None
    mid_stream = [any(c.get(p, 0) < end for p, end in pub.items()) for c, pub in kills]
    assert any(mid_stream), f"every kill landed with nothing in flight: {kills}"

    # Every proposal: one settled status, with the outcome it would have had anyway.
    for p in plan:
        status = kafka_gateway.status(p.invocation_id, operator(kafka_gateway))
        assert status is not None and status["settled"] is True, (p, status)
        assert status["outcome"] == p.expect, (p, status)

    # C9: exactly one audit record per invocation, with its outcome.
    audit = [
        r for r in kafka_gateway.audit(session=operator(kafka_gateway)) if r["invocation_id"] in ids
    ]
    per_invocation = Counter(r["invocation_id"] for r in audit)
    assert set(per_invocation) == ids and set(per_invocation.values()) == {1}
    assert all(r["outcome"] == by_id[r["invocation_id"]].expect for r in audit)

    # C12: every ticket that executed exists exactly once; nothing else ran.
    effects = [e for e in kafka_gateway.effects() if e["seq"] not in effects_before]
    assert {e["tool"] for e in effects} == {"tickets.create"}, effects
    per_call = Counter(e["invocation_id"] for e in effects)
    assert not {i: n for i, n in per_call.items() if n > 1}, "a call ran twice"
    executed = {p.invocation_id for p in plan if p.expect == "executed" and p.key}
    assert set(per_call) == executed
    per_key = Counter(
        (by_id[e["invocation_id"]].tenant, by_id[e["invocation_id"]].key) for e in effects
    )
    assert set(per_key.values()) == {1}
    assert set(Counter(e["token"] for e in effects).values()) == {1}

    leftovers = assert_no_second_decision(kafka_deployment, ids)
    print(f"decider kills (committed, published): {kills}; aborted leftovers seen: {leftovers}")
    assert leftovers == 0  # read_committed hides the killed decider's open transaction

    # Replays serve the original result (C8); the approval UI sees every refund once.
    first_result = {
        (p.tenant, p.key): (kafka_gateway.status(p.invocation_id, operator(kafka_gateway)) or {})[
            "result"
        ]
        for p in plan
        if p.invocation_id in executed
    }
    for p in plan:
        if p.expect == "replayed":
            assert (kafka_gateway.status(p.invocation_id, operator(kafka_gateway)) or {})[
                "result"
            ] == first_result[(p.tenant, p.key)]
    refunds = {p.invocation_id for p in plan if p.expect == "approval_required"}
    assert refunds <= {r["invocation_id"] for r in kafka_gateway.pending(operator(kafka_gateway))}
    assert kafka_gateway.verify_audit().ok


def assert_no_second_decision(kafka_deployment: Deployment, ids: set[str]) -> int:
    """No invocation of ``ids`` was decided twice; returns how many leftover copies the
    ``events`` topic shows (``read_committed``: none expected).

    Event ids are deterministic (the decider derives them from the causing event), so a
    copy left by an aborted attempt has the id of the event its redo committed. Hence:
    per invocation, each ``ONCE`` event type has one event id; copies of one id are the
    same decision (equal but for ``occurred_at``, the clock of the attempt) written by
    different transactions, at most one of which the decider's changelog names as
    committed (it names every committed transaction that changed the decider's state).
    """
    committed_tokens = read_committed_changelog(
        kafka_deployment.bootstrap, kafka_deployment.topics, "invocations"
    ).tokens
    copies: dict[str, list[tuple[str, ev.Event]]] = defaultdict(list)
    ids_per_type: dict[tuple[str, str], set[str]] = defaultdict(set)
    for record, event in kafka_deployment.events():
        if event.invocation_id not in ids:
            continue
        txn = record.headers.get(HEADER_TXN, b"").decode()
        copies[event.event_id].append((txn, event))
        ids_per_type[(event.invocation_id, event.event_type)].add(event.event_id)
    twice = {k: v for k, v in ids_per_type.items() if k[1] in ONCE and len(v) > 1}
    assert not twice, f"decided twice: {twice}"
    decided = {inv for inv, kind in ids_per_type if kind in DECISIONS}
    assert decided == ids, f"undecided: {ids - decided}"
    leftovers = 0
    for event_id, seen in copies.items():
        if len(seen) == 1:
            continue
        leftovers += len(seen) - 1
        tokens = [txn for txn, _ in seen]
        assert len(set(tokens)) == len(tokens), f"{event_id} twice in one transaction"
        first = replace(seen[0][1], occurred_at=0)
        if first.event_type in DECISIONS:
            assert all(replace(e, occurred_at=0) == first for _, e in seen), seen
            assert sum(t in committed_tokens for t in tokens) <= 1, f"{event_id} committed twice"
    return leftovers


# --- replay and the audit chain ----------------------------------------------------------------


def test_replay_rebuilds_identical_projections(kafka_gateway: Gateway) -> None:
    """docs/contract.md "Shape": folding the ``events`` log from offset 0 through the projections
    gives, byte for byte, the live compacted views (after the kills above, too)."""
    alice = token(kafka_gateway, "alice", "acme", "support")
    assert (
        kafka_gateway.propose(alice, "tickets.read", {"ticket_id": "T-77"})["outcome"] == "executed"
    )
    # The views are eventually consistent: the pending and decisions projections may still
    # be folding the tail of the log. Nothing is in flight, so they converge within a few
    # seconds or never (a real difference). Replay equality is what is asserted, so
    # it is what is waited for.
    deadline = time.monotonic() + 30
    while not (report := replay(kafka_gateway))["equal"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert report["events"] > 0
    assert report["equal"] is True, report
    # Every view the scenario writes (no pending approval is left; no limit is in the profile).
    written = {k: v for k, v in report["views"].items() if k not in ("pending", "usage")}
    assert all(v["records"] > 0 for v in written.values()), report


def test_audit_chain_detects_a_changed_or_dropped_record(kafka_gateway: Gateway) -> None:
    """C9: the audit view's hash chains verify against their heads; changing one field
    of one record, or dropping the last record of a chain, is detected."""
    alice = token(kafka_gateway, "alice", "acme", "support")
    key = f"audit-{uuid.uuid4().hex[:8]}"
    first = kafka_gateway.propose(alice, "refunds.issue", {**REFUND, "order_id": "ORD-9"}, key)
    approval = kafka_gateway.approve(first["invocation_id"], alice)
    done = kafka_gateway.propose(alice, "refunds.issue", {**REFUND, "order_id": "ORD-9"}, key,
                        approval["approval_id"])  # fmt: skip
    assert done["outcome"] == "executed", done
    # The answer follows the events; the status view is a projection that may lag them.
    wait_for(
        lambda: (
            "partition_key"
            in (kafka_gateway.status(done["invocation_id"], operator(kafka_gateway)) or {})
        ),
        30,
        "the executed call's status",
    )
    chain_key = str(
        (kafka_gateway.status(done["invocation_id"], operator(kafka_gateway)) or {})[
            "partition_key"
        ]
    )
    wait_for(
        lambda: bool(kafka_gateway.audit(done["invocation_id"], session=operator(kafka_gateway))),
        30,
        "the executed call's record",
    )

    records = kafka_gateway.audit(session=operator(kafka_gateway))
    heads = [value for _, value in kafka_gateway.backend.view_items("audit_head")]
    assert verify_chain(records, heads=heads).ok

    chain = [i for i, r in enumerate(records) if r["partition_key"] == chain_key]
    assert len(chain) >= 2
    tampered = [dict(r) for r in records]
    assert tampered[chain[0]]["proposed_by"] == "model"
    tampered[chain[0]]["proposed_by"] = "human"  # one field of one record
    bad = verify_chain(tampered, heads=heads)
    assert not bad.ok and "hash" in (bad.reason or ""), bad

    cut = [r for i, r in enumerate(records) if i != chain[-1]]
    assert verify_chain(cut, heads=heads).ok is False
    assert verify_chain(cut).ok  # without the head, a shorter chain looks valid
    assert verify_chain(records, heads=heads).ok  # the untouched records still verify


def unsettled_report(
    kafka_deployment: Deployment, kafka_gateway: Gateway, plan: list[Planned]
) -> str:
    """Which planned proposals never settled, with their events: the failure message."""
    rows = dict(kafka_gateway.backend.view_items("status"))
    stuck = [p for p in plan if not rows.get(p.invocation_id, {}).get("settled")]
    events = defaultdict(list)
    for record, event in kafka_deployment.events():
        events[event.invocation_id].append(f"{event.event_type}@{record.partition}:{record.offset}")
    lines = [f"{len(stuck)} of {len(plan)} unsettled:"]
    for p in stuck[:8]:
        lines.append(f"  {p.tool} key={p.key} expect={p.expect}: {rows.get(p.invocation_id)}")
        lines.append(f"    events: {events.get(p.invocation_id)}")
    lines.append(kafka_deployment.readable_ends())
    return "\n".join(lines)
