"""One engine, three runners: the same cases against memory, the embedded store and Kafka.

Each runner is only its I/O and transaction boundary around ``callgate.adapters.engine``
(docs/adr/0028-one-engine.md), so the same inputs must give the same outputs on every one:
the handled events with their states carried per key, an input ``handle`` cannot process
dead-lettered (and the stream going on), the types a process does not react to consumed
unhandled, and ``follow_up`` run once its inputs' outputs are committed. The Kafka runner
runs on a real broker (marked ``kafka``).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest
from confluent_kafka.admin import AdminClient
from tests.toys import Counting, proposal

from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.embedded.runner import EmbeddedRunner
from callgate.adapters.embedded.store import EmbeddedStore
from callgate.adapters.kafka.client import (
    FAST_GROUP_SETTINGS,
    make_producer,
    publish,
    read_partitions_to_end,
)
from callgate.adapters.kafka.runner import KafkaRunner
from callgate.adapters.kafka.topics import Topics, ensure_topics
from callgate.adapters.memory import MemoryRunner
from callgate.adapters.view_codec import JsonViews
from callgate.domain.events import (
    DryRunFailed,
    DryRunRecorded,
    Event,
    EventDeadLettered,
    ExecutionStarted,
    ToolCallProposed,
)
from callgate.domain.process_port import Output

CODEC = AvroCodec.default()
NOW = 1_700_000_000_000
OUTPUT_TOPICS = ("events", "dead-letter")


class Refusing(Counting):
    """Counting, except that an input it cannot process raises (deterministic: dead-letter)."""

    def __init__(self, refuse: str) -> None:
        super().__init__()
        self.refuse = refuse

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, Sequence[Output]]:
        if event.event_id == self.refuse:
            raise ValueError(f"cannot process {event.event_id}")
        return super().handle(state, event, now_ms)


class Following(Counting):
    """One event from ``handle``, its completion from ``follow_up`` (as the executor)."""

    name = "follower"

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, Sequence[Output]]:
        first = DryRunFailed(
            event_id=f"dr-{event.event_id}",
            invocation_id=event.invocation_id,
            partition_key=event.partition_key,
            message="first half",
        )
        return state + 1, [first]

    def follow_up(
        self, state: int, committed: Sequence[Event], now_ms: int
    ) -> tuple[int, Sequence[Output]]:
        done = [
            DryRunRecorded(
                event_id=f"rec-{e.event_id}",
                invocation_id=e.invocation_id,
                partition_key=e.partition_key,
                snapshot_json="{}",
                snapshot_hash="h",
            )
            for e in committed
            if isinstance(e, DryRunFailed)
        ]
        return state, done


class Selective(Counting):
    """Reacts to proposals only; ``reacts_to`` says so, and the others are not handled."""

    name = "selective"
    inputs = frozenset({"requests", "events"})
    reacts_to = frozenset({ToolCallProposed})
    handled: list[str]

    def __init__(self) -> None:
        super().__init__()
        self.handled = []

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, Sequence[Output]]:
        self.handled.append(event.event_id)
        return super().handle(state, event, now_ms)


class Chaining(Following):
    """``follow_up`` starts another round for the first half: three commits per input."""

    name = "chaining"

    def follow_up(
        self, state: int, committed: Sequence[Event], now_ms: int
    ) -> tuple[int, Sequence[Output]]:
        again = [
            DryRunFailed(
                event_id=f"dr2-{e.event_id}",
                invocation_id=e.invocation_id,
                partition_key=e.partition_key,
                message="second half",
            )
            for e in committed
            if isinstance(e, DryRunFailed) and e.event_id.startswith("dr-")
        ]
        last = [e for e in committed if isinstance(e, DryRunFailed) and e not in again]
        state, done = super().follow_up(
            state, [e for e in last if e.event_id.startswith("dr2-")], now_ms
        )
        return state + len(again), [*again, *done]


class Mutating(Counting):
    """State changed in place (a dict); an input it refuses changes it before raising, so
    the runner must undo the change, not only skip the outputs."""

    name = "mutating"

    def __init__(self, refuse: str) -> None:
        super().__init__()
        self.refuse = refuse
        self.calls: list[str] = []  # the event ids ``handle`` was given, in order

    def initial_state(self) -> dict[str, int]:  # type: ignore[override]
        return {"n": 0}

    def handle(  # type: ignore[override]
        self, state: dict[str, int], event: Event, now_ms: int
    ) -> tuple[dict[str, int], Sequence[Output]]:
        self.calls.append(event.event_id)
        state["n"] += 1
        if event.event_id == self.refuse:
            state["n"] += 100
            raise ValueError(f"cannot process {event.event_id}")
        _, outputs = super().handle(state["n"] - 1, event, now_ms)
        return state, outputs[:1]

    def dump_state(self, state: dict[str, int]) -> bytes:  # type: ignore[override]
        return json.dumps(state, sort_keys=True).encode()

    def load_state(self, data: bytes) -> dict[str, int]:  # type: ignore[override]
        loaded: dict[str, int] = json.loads(data)
        return loaded


class Timing(Counting):
    """An input in ``arm`` sets its key's timer due at once; ``due`` emits one event and
    clears it. State: (inputs counted, due time or 0)."""

    name = "timing"

    def __init__(self, arm: frozenset[str]) -> None:
        super().__init__()
        self.arm = arm

    def initial_state(self) -> tuple[int, int]:  # type: ignore[override]
        return (0, 0)

    def handle(  # type: ignore[override]
        self, state: tuple[int, int], event: Event, now_ms: int
    ) -> tuple[tuple[int, int], Sequence[Output]]:
        return (state[0] + 1, now_ms if event.event_id in self.arm else state[1]), []

    def next_due(self, state: tuple[int, int]) -> int | None:  # type: ignore[override]
        return state[1] or None

    def due(  # type: ignore[override]
        self, state: tuple[int, int], now_ms: int
    ) -> tuple[tuple[int, int], Sequence[Output]]:
        fired = DryRunFailed(
            event_id=f"timer-{state[0]}-{now_ms}",
            invocation_id="timer",
            partition_key="timer",
            message=f"fired after {state[0]}",
        )
        return (state[0], 0), [fired]

    def dump_state(self, state: tuple[int, int]) -> bytes:  # type: ignore[override]
        return json.dumps(state).encode()

    def load_state(self, data: bytes) -> tuple[int, int]:  # type: ignore[override]
        n, due = json.loads(data)
        return (n, due)


class Port(Protocol):
    """A runner under test: publish inputs, then read what it wrote once settled."""

    def written(self, process: Any, inputs: Sequence[Event], expect: int) -> list[Event]:
        """Run ``process`` over ``inputs``; the events it wrote (``expect`` of them)."""
        ...


class MemoryPort:
    def written(self, process: Any, inputs: Sequence[Event], expect: int) -> list[Event]:
        runner = MemoryRunner([process], now_ms=NOW)
        runner.publish(*inputs)
        runner.run()
        runner.advance(0)  # timers due now
        ids = {e.event_id for e in inputs}
        return [e for e in runner.log.events if e.event_id not in ids]


class EmbeddedPort:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def written(self, process: Any, inputs: Sequence[Event], expect: int) -> list[Event]:
        store = EmbeddedStore(self.directory / uuid.uuid4().hex, CODEC)
        runner = EmbeddedRunner(store, [process], CODEC, lambda: NOW)
        assert runner.acquire(5)
        try:
            store.append(inputs)
            runner.run_until_idle()
            return [CODEC.decode(r.payload) for t in OUTPUT_TOPICS for r in store.read_log(t)]
        finally:
            runner.release()
            store.close()


class KafkaPort:
    def __init__(self, bootstrap: str, directory: Path) -> None:
        self.bootstrap = bootstrap
        self.directory = directory

    def written(self, process: Any, inputs: Sequence[Event], expect: int) -> list[Event]:
        topics = Topics(f"t{uuid.uuid4().hex[:8]}", 2)
        ensure_topics(
            AdminClient({"bootstrap.servers": self.bootstrap}),
            topics.specs([process], {"counts": process.name}),
        )
        runner = KafkaRunner(
            process, CODEC, topics, self.bootstrap, "i1", self.directory / uuid.uuid4().hex,
            lambda: NOW, batch_timeout_ms=50, consumer_overrides=FAST_GROUP_SETTINGS,
            views=JsonViews(),
        )  # fmt: skip
        stop = threading.Event()
        failed: list[BaseException] = []

        def run() -> None:
            try:
                runner.run(stop)
            except BaseException as exc:
                failed.append(exc)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        try:
            publish(make_producer(self.bootstrap), CODEC, topics, inputs)
            deadline = time.monotonic() + 60
            while len(found := self._read(topics)) < expect and not failed:
                assert time.monotonic() < deadline, f"{len(found)} of {expect} events written"
                time.sleep(0.2)
            return found
        finally:
            stop.set()
            worker.join(timeout=30)
            assert not failed, failed

    def _read(self, topics: Topics) -> list[Event]:
        return [
            CODEC.decode(r.value or b"")
            for t in OUTPUT_TOPICS
            for r in read_partitions_to_end(self.bootstrap, topics.physical(t))
        ]


@pytest.fixture(params=["memory", "embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def port(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Port]:
    if request.param == "memory":
        yield MemoryPort()
    elif request.param == "embedded":
        yield EmbeddedPort(tmp_path)
    else:
        yield KafkaPort(request.getfixturevalue("kafka_bootstrap"), tmp_path)


def by_id(events: Sequence[Event]) -> dict[str, Event]:
    return {e.event_id: e for e in events}


def test_handle_carries_each_keys_state_from_input_to_input(port: Port) -> None:
    inputs = [proposal(1, "k-a"), proposal(2, "k-b"), proposal(3, "k-a"), proposal(4, "k-a")]
    out = by_id(port.written(Counting(), inputs, expect=4))
    attempts = {i: out[f"out-in-{i}"] for i in (1, 2, 3, 4)}
    assert all(isinstance(e, ExecutionStarted) for e in attempts.values())
    assert [getattr(attempts[i], "attempt", None) for i in (1, 3, 4)] == [1, 2, 3]
    assert getattr(attempts[2], "attempt", None) == 1
    assert len(out) == 4


def test_an_input_handle_cannot_process_is_dead_lettered_and_the_stream_goes_on(
    port: Port,
) -> None:
    inputs = [proposal(1, "k-a"), proposal(2, "k-a"), proposal(3, "k-a")]
    written = port.written(Refusing(refuse="in-2"), inputs, expect=3)
    dead = [e for e in written if isinstance(e, EventDeadLettered)]
    assert len(dead) == 1 and dead[0].producer == "counter"
    assert dead[0].invocation_id == "inv-2" and dead[0].source_topic == "requests"
    started = {e.event_id: e for e in written if isinstance(e, ExecutionStarted)}
    # The failed input changed nothing: the next one counts on from the first.
    assert sorted(started) == ["out-in-1", "out-in-3"]
    assert getattr(started["out-in-3"], "attempt", None) == 2


def test_follow_up_runs_once_the_outputs_of_handle_are_committed(port: Port) -> None:
    inputs = [proposal(1, "k-a"), proposal(2, "k-b")]
    out = by_id(port.written(Following(), inputs, expect=4))
    assert {i for i, e in out.items() if isinstance(e, DryRunFailed)} == {"dr-in-1", "dr-in-2"}
    assert {i for i, e in out.items() if isinstance(e, DryRunRecorded)} == {
        "rec-dr-in-1",
        "rec-dr-in-2",
    }


def test_a_type_the_process_does_not_react_to_is_consumed_unhandled(port: Port) -> None:
    process = Selective()
    # The process's own ExecutionStarted outputs come back on "events": not reacted to.
    out = port.written(process, [proposal(1, "k-a"), proposal(2, "k-a")], expect=2)
    assert sorted(e.event_id for e in out) == ["out-in-1", "out-in-2"]
    assert set(process.handled) == {"in-1", "in-2"}


def test_follow_up_chains_until_a_round_emits_nothing(port: Port) -> None:
    out = by_id(port.written(Chaining(), [proposal(1, "k-a"), proposal(2, "k-b")], expect=6))
    for i in (1, 2):
        assert {f"dr-in-{i}", f"dr2-dr-in-{i}", f"rec-dr2-dr-in-{i}"} <= set(out)
    assert len(out) == 6


def test_a_state_changed_in_place_by_a_refused_input_is_undone_mid_batch_handling_nothing_again(
    port: Port,
) -> None:
    inputs = [proposal(1, "k-a"), proposal(2, "k-a"), proposal(3, "k-a"), proposal(4, "k-a")]
    process = Mutating(refuse="in-3")
    written = port.written(process, inputs, expect=4)
    started = {
        e.event_id: getattr(e, "attempt", None) for e in written if isinstance(e, ExecutionStarted)
    }
    # in-3 added 101 in place before raising: the next input counts on from in-2's state.
    assert started == {"out-in-1": 1, "out-in-2": 2, "out-in-4": 3}
    assert sum(isinstance(e, EventDeadLettered) for e in written) == 1
    # Undone without handling anything again: a process that calls a provider in
    # ``handle`` (the executor's dry-runs) is not called twice for one input.
    assert sorted(process.calls) == ["in-1", "in-2", "in-3", "in-4"]


def test_a_timer_set_by_handle_fires_due_once_per_key(port: Port) -> None:
    inputs = [proposal(1, "k-a"), proposal(2, "k-b"), proposal(3, "k-a")]
    # The last input of each key arms its timer: however the inputs are batched, each key's
    # timer fires once, after all of its inputs.
    written = port.written(Timing(arm=frozenset({"in-2", "in-3"})), inputs, expect=2)
    fired = [e for e in written if isinstance(e, DryRunFailed)]
    assert sorted(getattr(e, "message", "") for e in fired) == ["fired after 1", "fired after 2"]
