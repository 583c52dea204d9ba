"""The embedded runner's round transaction and caches (ADR 0006, "Throughput").

A round runs every process in one ``BEGIN IMMEDIATE`` transaction, decodes each log row
once and keeps committed state objects between rounds. None of it may change a byte of
what the processes produce, and a cached state must never outlive a rolled-back
transaction or a change of lock holder (exactly once per process and input, C12).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.toys import proposal
from tools.bench_core import mixed_proposals

from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.embedded.runner import EmbeddedRunner
from callgate.adapters.embedded.store import EmbeddedStore
from callgate.bootstrap import Settings, bootstrap
from callgate.domain.canonical import state_json
from callgate.domain.events import ApprovalExpired, Event, ExecutionStarted
from callgate.domain.process_port import Output, Process, ViewRecord
from callgate_projections import keeps_states_immutable

CODEC = AvroCodec.default()
NOW = 1_800_000_000_000


class Crash(BaseException):
    """A process dying mid-batch (not a poison event, which is dead-lettered instead)."""


class InPlace:
    """Counts proposals per key in a dict it changes in place and returns (as the decider
    and the executor do); one ``ExecutionStarted`` per input, ``attempt`` = the count."""

    name = "in-place"
    inputs = frozenset({"requests"})
    recovers = False

    def __init__(self) -> None:
        self.crash_on: str | None = None

    def initial_state(self) -> dict[str, int]:
        return {"n": 0}

    def handle(
        self, state: dict[str, int], event: Event, now_ms: int
    ) -> tuple[dict[str, int], Sequence[Output]]:
        state["n"] += 1
        if event.event_id == self.crash_on:
            raise Crash(event.event_id)
        started = ExecutionStarted(
            event_id=f"out-{event.event_id}",
            invocation_id=event.invocation_id,
            partition_key=event.partition_key,
            occurred_at=now_ms,
            execution_token=event.event_id,
            attempt=state["n"],
        )
        return state, [started]

    def due(self, state: dict[str, int], now_ms: int) -> tuple[dict[str, int], Sequence[Output]]:
        return state, ()

    def next_due(self, state: dict[str, int]) -> int | None:
        return None

    def follow_up(
        self, state: dict[str, int], committed: Sequence[Event], now_ms: int
    ) -> tuple[dict[str, int], Sequence[Output]]:
        return state, ()

    def recover(
        self, state: dict[str, int], now_ms: int
    ) -> tuple[dict[str, int], Sequence[Output]]:
        return state, ()

    def dump_state(self, state: dict[str, int]) -> bytes:
        return json.dumps(state).encode()

    def load_state(self, data: bytes) -> dict[str, int]:
        loaded: dict[str, int] = json.loads(data)
        return loaded


def open_runner(
    state_dir: Path, *processes: Process[Any], batch_size: int = 500, clock: list[int] | None = None
) -> EmbeddedRunner:
    now = clock if clock is not None else [NOW]
    store = EmbeddedStore(state_dir, CODEC)
    runner = EmbeddedRunner(store, processes, CODEC, lambda: now[0], batch_size=batch_size)
    assert runner.try_acquire()
    return runner


def stored_states(store: EmbeddedStore, process: str) -> dict[str, bytes]:
    with store.transaction() as tx:
        return dict(tx.states_after(process, "", 1_000_000))


def assert_each_input_counted_once(store: EmbeddedStore, keys: Sequence[str]) -> None:
    outputs = [CODEC.decode(r.payload) for r in store.read_log("events", limit=1_000_000)]
    started = [e for e in outputs if isinstance(e, ExecutionStarted)]
    assert sorted(e.event_id for e in started) == sorted(f"out-in-{i}" for i in range(len(keys)))
    for key in set(keys):
        attempts = sorted(e.attempt for e in started if e.partition_key == key)
        assert attempts == list(range(1, keys.count(key) + 1))
    expected = {key: json.dumps({"n": keys.count(key)}).encode() for key in set(keys)}
    assert stored_states(store, "in-place") == expected


def test_states_changed_in_place_are_written(tmp_path: Path) -> None:
    """Only projections may skip the dump of a state returned as the same object."""
    runner = open_runner(tmp_path, InPlace(), batch_size=4)
    assert not keeps_states_immutable(runner.processes[0])
    keys = [f"k{i % 3}" for i in range(20)]
    runner.store.append([proposal(i, k) for i, k in enumerate(keys)])
    runner.run_until_idle()
    assert_each_input_counted_once(runner.store, keys)


def test_a_failed_round_forgets_the_states_it_changed_in_place(tmp_path: Path) -> None:
    """C12: the crash rolls the round back; the cached objects it changed must go with it,
    or the inputs read again would be counted twice."""
    process = InPlace()
    runner = open_runner(tmp_path, process, batch_size=5)
    keys = [f"k{i % 2}" for i in range(10)]
    runner.store.append([proposal(i, k) for i, k in enumerate(keys)])
    process.crash_on = "in-7"  # in the second batch, after in-5 and in-6 changed their keys
    with pytest.raises(Crash):
        runner.run_until_idle()
    assert runner.store.position("in-place") == 5
    process.crash_on = None
    runner.run_until_idle()
    assert_each_input_counted_once(runner.store, keys)


class Seen(InPlace):
    """Reads ``events``: records when each event it saw occurred (view ``seen``)."""

    name = "seen"
    inputs = frozenset({"events"})

    def handle(
        self, state: dict[str, int], event: Event, now_ms: int
    ) -> tuple[dict[str, int], Sequence[Output]]:
        return state, [ViewRecord("seen", event.event_id, str(event.occurred_at))]


class Crasher(InPlace):
    """Reads ``requests`` after the others and crashes on ``crash_on``."""

    name = "crasher"

    def handle(
        self, state: dict[str, int], event: Event, now_ms: int
    ) -> tuple[dict[str, int], Sequence[Output]]:
        if event.event_id == self.crash_on:
            raise Crash(event.event_id)
        return state, ()


def test_no_process_sees_an_event_of_a_rolled_back_round(tmp_path: Path) -> None:
    """A row decoded inside a round that rolls back is forgotten: its ``seq`` is given to
    the row written on the next try, which differs here (the clock moved on)."""
    clock = [1_000]
    crasher = Crasher()
    runner = open_runner(tmp_path, InPlace(), Seen(), crasher, batch_size=5, clock=clock)
    keys = [f"k{i % 2}" for i in range(10)]
    runner.store.append([proposal(i, k) for i, k in enumerate(keys)])
    crasher.crash_on = "in-7"
    with pytest.raises(Crash):
        runner.run_until_idle()
    clock[0], crasher.crash_on = 2_000, None
    runner.run_until_idle()
    logged = [CODEC.decode(r.payload) for r in runner.store.read_log("events")]
    assert {e.event_id: str(e.occurred_at) for e in logged} == dict(runner.store.view_items("seen"))
    assert sorted({e.occurred_at for e in logged}) == [1_000, 2_000]
    assert_each_input_counted_once(runner.store, keys)


def test_a_runner_taking_the_lock_again_reads_what_another_runner_did(tmp_path: Path) -> None:
    """Between two holds of the lock another runner may have moved states on."""
    first = open_runner(tmp_path, InPlace())
    keys = [f"k{i % 3}" for i in range(18)]
    first.store.append([proposal(i, keys[i]) for i in range(6)])
    first.run_until_idle()
    first.release()
    second = open_runner(tmp_path, InPlace())
    second.store.append([proposal(i, keys[i]) for i in range(6, 12)])
    second.run_until_idle()
    second.release()
    assert first.try_acquire()
    first.store.append([proposal(i, keys[i]) for i in range(12, 18)])
    first.run_until_idle()
    assert_each_input_counted_once(first.store, keys)


# (proposals seen, timers fired, due time or None)
Armed = tuple[int, int, int | None]


class Arming:
    """Counts proposals, arming a 1 s timer each; ``due`` counts the firing and disarms."""

    name = "arming"
    inputs = frozenset({"requests"})
    recovers = False

    def initial_state(self) -> Armed:
        return (0, 0, None)

    def handle(self, state: Armed, event: Event, now_ms: int) -> tuple[Armed, Sequence[Output]]:
        return (state[0] + 1, state[1], event.occurred_at + 1000), ()

    def due(self, state: Armed, now_ms: int) -> tuple[Armed, Sequence[Output]]:
        expired = ApprovalExpired(
            event_id=f"exp-{state[0]}", invocation_id="i", partition_key="a", stage="pending"
        )
        return (state[0], state[1] + 1, None), [expired]

    def next_due(self, state: Armed) -> int | None:
        return state[2]

    def follow_up(
        self, state: Armed, committed: Sequence[Event], now_ms: int
    ) -> tuple[Armed, Sequence[Output]]:
        return state, ()

    def recover(self, state: Armed, now_ms: int) -> tuple[Armed, Sequence[Output]]:
        return state, ()

    def dump_state(self, state: Armed) -> bytes:
        return json.dumps(state).encode()

    def load_state(self, data: bytes) -> Armed:
        seen, fired, due = json.loads(data)
        return (seen, fired, due)


def test_a_timer_and_new_input_of_one_key_in_one_round(tmp_path: Path) -> None:
    """Timers fire first, then the round's inputs see the state the timer left (C11)."""
    clock = [5_000]
    runner = open_runner(tmp_path, Arming(), clock=clock)
    runner.store.append([proposal(0, "a", occurred_at=5_000)])
    runner.run_until_idle()
    clock[0] = 6_000
    runner.store.append([proposal(1, "a", occurred_at=6_000)])
    assert runner.run_once() == 2  # one timer, one input, one transaction
    expired = [CODEC.decode(r.payload) for r in runner.store.read_log("events")]
    assert [e.event_id for e in expired] == ["exp-1"]
    assert stored_states(runner.store, "arming") == {"a": b"[2, 1, 7000]"}
    assert runner.store.position("arming") == 2


@pytest.mark.parametrize("cache_keys", [0, 16, 16_384])
def test_rounds_and_caches_give_the_bytes_of_a_plain_fold(tmp_path: Path, cache_keys: int) -> None:
    """The real processes over the benchmark mix, many small rounds, a tiny cache that
    evicts all the time or none: the decider's events and every process's stored state and
    views are exactly what folding the log event by event gives (docs/contract.md "Shape").
    The decider runs inside the invocations process (ADR 0077); its part of each stored
    state is what the decider alone makes of the log."""
    app = bootstrap(Settings(state_dir=tmp_path, dev=True), clock=lambda: NOW)
    store = EmbeddedStore(tmp_path, CODEC)
    store.append(mixed_proposals(app, 120))
    runner = EmbeddedRunner(
        store, app.processes(), CODEC, app.clock, batch_size=7, state_cache_keys=cache_keys
    )
    assert runner.try_acquire()
    runner.run_until_idle()
    runner.release()
    log = [(row.topic, CODEC.decode(row.payload)) for row in store.read_log(limit=1_000_000)]
    for process in [app.decider(), *app.projections()]:
        states: dict[str, Any] = {}
        emitted: list[Output] = []
        for topic, event in log:
            if topic not in process.inputs:
                continue
            key = event.partition_key
            old = states[key] if key in states else process.initial_state()
            before = process.dump_state(old)
            states[key], outputs = process.handle(old, event, NOW)
            emitted += outputs
            if keeps_states_immutable(process):
                assert process.dump_state(old) == before
        initial = process.dump_state(process.initial_state())
        dumped = {key: process.dump_state(state) for key, state in states.items()}
        changed = {key: blob for key, blob in dumped.items() if blob != initial}
        if process.name == "decider":
            stored = {
                key: state_json(json.loads(blob)["decider"])
                for key, blob in stored_states(store, "invocations").items()
            }
            assert stored == changed
        else:
            assert stored_states(store, process.name) == changed
        if process.name == "decider":
            # In order per key: the invocations process folds a key's executor answers
            # before its next input, the plain fold meets them later in the log.
            def by_key(events: Iterable[Event]) -> dict[str, list[bytes]]:
                grouped: dict[str, list[bytes]] = {}
                for e in events:
                    grouped.setdefault(e.partition_key, []).append(CODEC.encode(e))
                return grouped

            produced = by_key(e for e in emitted if isinstance(e, Event))
            logged = by_key(e for _, e in log if e.producer == "decider")
            assert produced == logged and produced
        views: dict[tuple[str, str], str] = {}
        for record in emitted:
            if isinstance(record, ViewRecord):
                if record.value_json is None:
                    views.pop((record.view, record.key), None)
                else:
                    views[(record.view, record.key)] = record.value_json
        for view in getattr(process, "views", ()):
            mine = {k: v for (name, k), v in views.items() if name == view}
            assert dict(store.view_items(view)) == mine
