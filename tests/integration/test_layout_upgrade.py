"""A deployment of the three-process layout taken over by ``invocations`` (ADR 0077):
the embedded store's states move once and exactly; what cannot move exactly is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.embedded.store import EmbeddedStore
from callgate.adapters.kafka.serve import refuse_earlier_layout
from callgate.adapters.kafka.topics import Topics
from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.codes import Code, Rejection
from callgate.domain.scope import bound_id

REFUND = {"order_id": "ORD-1", "amount_cents": 25_000, "currency": "EUR", "issued_by": "alice"}
TICKET = {"title": "Printer", "requester_id": "alice"}


def earlier(tmp_path: Path) -> App:
    """An app whose processes are the earlier layout's: the decider and the executor."""
    app = bootstrap(Settings(state_dir=tmp_path, dev=True))

    def processes() -> list[Any]:
        return [app.decider(), app.executor(), *app.projections()]

    app.processes = processes  # type: ignore[method-assign]
    return app


def earlier_with_a_call(tmp_path: Path) -> App:
    """The earlier layout's store after one executed call."""
    old = earlier(tmp_path)
    gate = old.gateway()
    try:
        gate.propose(token(old, "alice", ("support",)), "tickets.create", TICKET)
    finally:
        gate.close()
    return old


def token(app: App, user: str, roles: tuple[str, ...]) -> str:
    return app.session_issuer.issue(user, "acme", roles, app.clock())


def test_an_earlier_store_is_adopted_exactly(tmp_path: Path) -> None:
    """Given calls made by the earlier layout (an executed call with an idempotency key,
    a refund waiting for approval), the new layout replays the key's result and runs the
    approved refund once."""
    old = earlier(tmp_path)
    gate = old.gateway()
    try:
        alice = token(old, "alice", ("support",))
        made = gate.propose(alice, "tickets.create", TICKET, idempotency_key="K")
        held = gate.propose(alice, "refunds.issue", REFUND, idempotency_key="R")
    finally:
        gate.close()
    assert made["outcome"] == "executed" and held["outcome"] == "approval_required"
    effects = len(old.ledger.effects())

    new = bootstrap(Settings(state_dir=tmp_path, dev=True))
    gate = new.gateway()
    try:
        alice = token(new, "alice", ("support",))
        again = gate.propose(alice, "tickets.create", TICKET, idempotency_key="K")
        assert again["outcome"] == "replayed", again
        assert again["result"] == made["result"]
        bob = token(new, "bob", ("finance-approver",))
        gate.approve(held["invocation_id"], bob)
        final = gate.wait(held["invocation_id"], alice, 10)
    finally:
        gate.close()
    assert final["outcome"] == "executed", final
    assert len(new.ledger.effects()) == effects + 1
    store = EmbeddedStore(tmp_path, AvroCodec.default())
    try:
        assert store.position("invocations") > 0
    finally:
        store.close()


def test_input_the_earlier_layout_left_is_handled_before_the_move(tmp_path: Path) -> None:
    """A proposal the earlier decider has not handled yet is decided and run by the earlier
    layout first (its own runner, to idle), then the states move: one effect, settled."""
    earlier_with_a_call(tmp_path)
    codec = AvroCodec.default()
    store = EmbeddedStore(tmp_path, codec)
    try:
        (row,) = store.read_log("requests")
        proposed = codec.decode(row.payload)
        assert isinstance(proposed, ev.ToolCallProposed)
        inv = bound_id(proposed.session_token, "left-over")  # as the SDK binds ids
        left = dataclasses.replace(
            proposed,
            event_id="left-over",
            invocation_id=inv,
            partition_key=partition_key("acme", None, inv),
        )
        store.append([left])
        new = bootstrap(Settings(state_dir=tmp_path, dev=True))
        runner = new.embedded_runner(store, codec)
        assert store.position("invocations") >= store.position("decider") > 0
        assert runner.try_acquire()
        try:
            runner.run_until_idle()
        finally:
            runner.release()
        outcomes = [codec.decode(r.payload) for r in store.read_log("events", limit=10_000)]
        mine = [e for e in outcomes if e.invocation_id == inv]
        assert [type(e) for e in mine if isinstance(e, ev.ExecutionSucceeded)] != []
        assert len([e for e in mine if isinstance(e, ev.ExecutionStarted)]) == 1
    finally:
        store.close()


def test_a_store_held_by_another_process_is_not_taken_over(tmp_path: Path) -> None:
    """The earlier layout's store while another runner holds its lock: refused, coded
    ``busy``, and nothing moves."""
    old = earlier_with_a_call(tmp_path)
    codec = AvroCodec.default()
    store = EmbeddedStore(tmp_path, codec)
    holder = old.embedded_runner(store, codec)
    assert holder.try_acquire()
    try:
        with pytest.raises(Rejection) as refused:
            bootstrap(Settings(state_dir=tmp_path, dev=True)).embedded_runner(store, codec)
        assert refused.value.code is Code.BUSY
        assert store.position("invocations") == 0
    finally:
        holder.release()
        store.close()


def test_kafka_topics_of_the_earlier_layout_are_refused() -> None:
    topics = Topics("callgate", 6)
    earlier_topics = {topics.physical("requests"), topics.changelog("decider")}
    with pytest.raises(Rejection) as refused:
        refuse_earlier_layout(topics, earlier_topics)
    assert refused.value.code is Code.USAGE
    assert "callgate.changelog.decider" in refused.value.message
    refuse_earlier_layout(topics, set())  # a fresh deployment
    refuse_earlier_layout(topics, {*earlier_topics, topics.changelog("invocations")})
