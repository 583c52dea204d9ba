"""The Kafka runner on Apache Kafka: exactly once, kill -9, timers.

Toy processes (``tests.toys``) stand in for the deciders; what is under test is the runner's
commit sequence (outputs + changelog state + input offsets in one Kafka transaction), its
abort-and-rewind, restore from the changelog, dead-lettering (``malformed_event``) and timers.

How "no duplicates" is proven without trusting ``read_committed`` alone: the proof also
holds for a reader that sees the committed outputs *and* leftovers of aborted transactions.
Every record the runner writes carries its transaction's token (header ``cg-txn``). Which
tokens committed is read from the broker alone: the changelog's committed bound is a
consumer-group offset, committed atomically with each transaction, and the changelog
records before it link back through ``cg-prev`` (``callgate.adapters.kafka.state``). Then:

- committed outputs (token committed) hold each input's output exactly once, and the running
  counts per key are exactly 1..n: no loss, no duplicate, no double-counted state;
- every leftover (token not committed) is a byte-identical copy of a committed output: the
  aborted work was redone, not added to. Outputs carry deterministic ids derived from the
  input, so this check does not depend on the token bookkeeping being right.
On Apache Kafka the leftovers are simply absent.

Run as a worker subprocess by the SIGKILL test: ``python -m tests.kafka_runner_main
--process test_kafka_runner:SlowCounting`` (this directory and the repository root on
``PYTHONPATH``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.kafka_support import Broker, committed_offsets
from tests.toys import Counting, Expiring, Recovering, proposal

from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.kafka.checkpoint import ProducerFenced
from callgate.adapters.kafka.client import (
    FAST_GROUP_SETTINGS,
    Record,
    make_consumer,
    make_producer,
    publish,
    read_partitions_to_end,
)
from callgate.adapters.kafka.consumer import JOIN_OVERDUE_S
from callgate.adapters.kafka.runner import KafkaRunner
from callgate.adapters.kafka.state import (
    HEADER_PREV,
    HEADER_TXN,
    ChangelogEntry,
    read_committed_changelog,
    select_committed,
)
from callgate.adapters.kafka.topics import Topics, ensure_topics
from callgate.adapters.view_codec import JsonViews
from callgate.domain.events import (
    ApprovalGranted,
    Event,
    EventDeadLettered,
    ExecutionStarted,
    ProposalRejected,
)
from callgate.domain.process_port import Output, Process

CODEC = AvroCodec.default()
REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 3  # few partitions: short rebalances; co-partitioning needs >1


# --- toy processes (the shared ones are in tests.toys) ----------------------------------------


class SlowCounting(Counting):
    """Counting with 2 ms per record, so that a SIGKILL often lands inside a transaction."""

    name = "slow-counter"

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, Sequence[Output]]:
        time.sleep(0.002)
        return super().handle(state, event, now_ms)


# --- helpers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deployment:
    bootstrap: str
    topics: Topics

    @classmethod
    def fresh(cls, bootstrap: str, *processes: Process[Any]) -> Deployment:
        """Topics under a new prefix: tests share one broker but no topics or groups."""
        topics = Topics(f"t{uuid.uuid4().hex[:8]}", PARTITIONS)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        ensure_topics(admin, topics.specs(processes, {"counts": "counter"}))
        return cls(bootstrap, topics)

    def publish(self, events: Sequence[Event]) -> None:
        producer = make_producer(self.bootstrap)
        publish(producer, CODEC, self.topics, events)

    def committed_inputs(self, process: str) -> int:
        """How many input records the group has committed (offsets are dense: no txns)."""
        requests = self.topics.physical("requests")
        offsets = committed_offsets(
            self.bootstrap, self.topics.group(process), requests, PARTITIONS
        )
        return sum(max(offset, 0) for offset in offsets.values())

    def wait_for_progress(self, process: str, since: int) -> None:
        wait_for(lambda: self.committed_inputs(process) > since, 60, f"{process} to commit")

    def read(self, logical: str) -> list[Record]:
        return read_partitions_to_end(self.bootstrap, self.topics.physical(logical))

    def runner(
        self,
        process: Process[Any],
        state_dir: Path,
        clock: Callable[[], int],
        batch_size: int = 200,
        join_overdue_s: float = JOIN_OVERDUE_S,
        batch_linger_ms: float = 0.0,
    ) -> KafkaRunner:
        return KafkaRunner(
            process, CODEC, self.topics, self.bootstrap, "i1", state_dir, clock,
            batch_size=batch_size, batch_timeout_ms=50, consumer_overrides=FAST_GROUP_SETTINGS,
            views=JsonViews(), join_overdue_s=join_overdue_s, batch_linger_ms=batch_linger_ms,
        )  # fmt: skip


def wall_clock() -> int:
    return int(time.time() * 1000)


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Running:
    """A runner on a thread; ``stop()`` joins it and re-raises what ended it."""

    def __init__(self, runner: KafkaRunner) -> None:
        self.runner = runner
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(runner,), daemon=True)
        self.thread.start()

    def _run(self, runner: KafkaRunner) -> None:
        try:
            runner.run(self.stop_event)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


@pytest.fixture
def running() -> Iterator[Callable[[KafkaRunner], Running]]:
    started: list[Running] = []

    def start(runner: KafkaRunner) -> Running:
        started.append(Running(runner))
        return started[-1]

    yield start
    for r in started:
        r.stop_event.set()
        r.thread.join(timeout=30)


def assert_counted_exactly_once(
    dep: Deployment, process: str, keys: Sequence[str], ignored: frozenset[int] = frozenset()
) -> int:
    """Committed outputs: one per input (but the ``ignored`` ones, by index), counts 1..n per
    key, states exact (module doc).

    Returns how many aborted-transaction leftovers the output topic shows (0 on Kafka).
    """
    changelog = read_committed_changelog(dep.bootstrap, dep.topics, process)
    counted = [i for i in range(len(keys)) if i not in ignored]
    expected = Counter(keys[i] for i in counted)
    assert {k: int(v) for k, v in changelog.states.items()} == dict(expected)

    committed: list[ExecutionStarted] = []
    leftovers: list[Record] = []
    for record in dep.read("events"):
        if record.headers.get(HEADER_TXN, b"").decode() in changelog.tokens:
            event = CODEC.decode(record.value or b"")
            assert isinstance(event, ExecutionStarted)
            committed.append(event)
        else:
            leftovers.append(record)
    ids = [ev.event_id for ev in committed]
    assert len(ids) == len(set(ids)), "a committed output is duplicated"
    assert sorted(ids) == sorted(f"out-in-{i}" for i in counted)
    for key, n in expected.items():
        attempts = sorted(ev.attempt for ev in committed if ev.partition_key == key)
        assert attempts == list(range(1, n + 1)), key
    by_id = {ev.event_id: ev for ev in committed}
    for record in leftovers:
        copy = CODEC.decode(record.value or b"")
        assert copy == by_id[copy.event_id], "aborted work differs from what was committed"
    view: dict[str, int] = {}
    for record in read_partitions_to_end(dep.bootstrap, dep.topics.view("counts")):
        if record.headers.get(HEADER_TXN, b"").decode() in changelog.tokens:
            view[(record.key or b"").decode()] = json.loads(record.value or b"null")
    assert view == dict(expected)
    return len(leftovers)


class CountingInPlace(Counting):
    """``Counting`` whose state object is mutated in place (as the decider's is): the
    runner's committed-state cache must never hand an aborted transaction's object on."""

    def handle(self, state: Any, event: Event, now_ms: int) -> tuple[Any, Sequence[Output]]:
        box: list[int] = state
        count, outputs = super().handle(box[0], event, now_ms)
        box[0] = count
        return box, outputs

    def initial_state(self) -> Any:
        return [0]

    def dump_state(self, state: Any) -> bytes:
        return str(state[0]).encode()

    def load_state(self, data: bytes) -> Any:
        return [int(data)]


# --- exactly once, with an abort and rewind ----------------------------------------------------


@pytest.mark.kafka
@pytest.mark.parametrize("kind", [Counting, CountingInPlace], ids=["immutable", "in-place"])
def test_counts_exactly_once_through_the_broker_across_an_aborted_transaction(
    kafka_bootstrap: str,
    tmp_path: Path,
    running: Callable[[KafkaRunner], Running],
    kind: type[Counting],
) -> None:
    """N inputs -> exactly N committed outputs and exact state, although the process fails
    mid-batch once (its partial outputs are aborted, the inputs rewound and redone)."""
    rng = random.Random(7)
    keys = [f"k{rng.randrange(13)}" for _ in range(1_500)]
    process = kind(fail_once_on=frozenset({"in-900"}))
    dep = Deployment.fresh(kafka_bootstrap, process)
    dep.publish([proposal(i, k) for i, k in enumerate(keys)])

    run = running(dep.runner(process, tmp_path, wall_clock))
    wait_for(lambda: dep.committed_inputs("counter") == len(keys), 60, "all inputs committed")
    run.stop()

    assert "in-900" not in process._fail_once_on  # the failure did happen
    assert_counted_exactly_once(dep, "counter", keys)


class _AbortFailsFatally:
    """The runner's producer, except that the first ``abort_transaction`` of a transaction
    that produced records (a failed batch's, not the placeholder one every new producer
    aborts at start) fails as librdkafka's can when the abort races a transaction just
    begun (INVALID_TXN_STATE, fatal; confluentinc/librdkafka#4849): nothing is aborted and
    the producer is left unusable."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.failed = False
        self.produced = False

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.produced = True
        self._real.produce(*args, **kwargs)

    def abort_transaction(self, *args: Any) -> None:
        if not self.failed and self.produced:
            self.failed = True
            raise KafkaException(KafkaError(KafkaError.INVALID_TXN_STATE, "injected", fatal=True))
        self._real.abort_transaction(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@pytest.mark.kafka
def test_a_fatally_failed_abort_replaces_the_producer_and_loses_nothing(
    kafka_bootstrap: str, tmp_path: Path, running: Callable[[KafkaRunner], Running]
) -> None:
    """The abort after a failed batch fails fatally: the runner replaces its producer (the
    new one fences the old and the coordinator aborts its open transaction) and goes on,
    every input counted exactly once."""
    rng = random.Random(11)
    keys = [f"k{rng.randrange(13)}" for _ in range(600)]
    process = Counting(fail_once_on=frozenset({"in-300"}))
    dep = Deployment.fresh(kafka_bootstrap, process)
    dep.publish([proposal(i, k) for i, k in enumerate(keys)])
    runner = dep.runner(process, tmp_path, wall_clock)
    broken = _AbortFailsFatally(runner._checkpoint.producer)
    runner._checkpoint.producer = broken  # type: ignore[assignment]
    run = running(runner)
    wait_for(lambda: dep.committed_inputs("counter") == len(keys), 60, "all inputs committed")
    run.stop()

    assert broken.failed and run.error is None, run.error
    replaced: object = runner._checkpoint.producer
    assert replaced is not broken
    assert_counted_exactly_once(dep, "counter", keys)


class CountingSome(Counting):
    """``Counting`` that ignores some inputs: no output, no state change (a no-op cycle)."""

    def __init__(self, ignore: frozenset[str], fail_once_on: frozenset[str]) -> None:
        super().__init__(fail_once_on)
        self._ignore = ignore

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, Sequence[Output]]:
        if event.event_id in self._ignore:
            return state, []
        return super().handle(state, event, now_ms)


@pytest.mark.kafka
def test_no_op_cycles_commit_later_and_are_redone_as_no_ops(
    kafka_bootstrap: str, tmp_path: Path, running: Callable[[KafkaRunner], Running]
) -> None:
    """Cycles that emit nothing and change no state defer their input positions to the next
    transaction (fewer transactions); an abort rewinds over deferred ones and they are no-ops
    again: every input still counts exactly once."""
    rng = random.Random(11)
    keys = [f"k{rng.randrange(7)}" for _ in range(900)]
    # Every third input is a no-op. Not the last ones: a trailing no-op commits only offsets,
    # in a transaction that produced nothing, and the test reads positions that such a
    # commit need not have moved yet.
    ignored = frozenset(i for i in range(len(keys)) if i % 3 == 0)
    process = CountingSome(frozenset(f"in-{i}" for i in ignored), frozenset({"in-601"}))
    dep = Deployment.fresh(kafka_bootstrap, process)
    dep.publish([proposal(i, k) for i, k in enumerate(keys)])

    run = running(dep.runner(process, tmp_path, wall_clock, batch_size=3))
    wait_for(lambda: dep.committed_inputs("counter") == len(keys), 60, "all inputs committed")
    run.stop()

    assert "in-601" not in process._fail_once_on  # the abort did happen
    assert_counted_exactly_once(dep, "counter", keys, ignored)


def transactions_for_paced_inputs(
    dep: Deployment, run: Running, keys: Sequence[str], gap_s: float
) -> int:
    """Once ``run``'s runner owns every partition, publish an input per key ``gap_s`` apart;
    when all are committed, stop it. Returns the transactions it committed meanwhile."""
    runner = run.runner
    wait_for(lambda: len(runner.owned_partitions) == PARTITIONS, 60, "the group join")
    before = runner.transactions
    producer = make_producer(dep.bootstrap)
    for i, key in enumerate(keys):
        time.sleep(gap_s)
        publish(producer, CODEC, dep.topics, [proposal(i, key)])
    wait_for(lambda: dep.committed_inputs("counter") == len(keys), 60, "all inputs committed")
    spent = runner.transactions - before
    run.stop()
    return spent


@pytest.mark.kafka
def test_no_op_inputs_one_at_a_time_do_not_each_cost_a_transaction(
    kafka_bootstrap: str, tmp_path: Path, running: Callable[[KafkaRunner], Running]
) -> None:
    """At low load the runner is idle after nearly every record. A no-op record's position
    waits for the next transaction, or for ``NOOP_COMMIT_DELAY_S``: 20 no-op records 100 ms
    apart cost a few offsets-only transactions, not one each, and the counted input's
    transaction carries every deferred position."""
    keys = [f"k{i % 3}" for i in range(21)]
    ignored = frozenset(range(20))
    process = CountingSome(frozenset(f"in-{i}" for i in ignored), frozenset())
    dep = Deployment.fresh(kafka_bootstrap, process)
    runner = dep.runner(process, tmp_path, wall_clock)  # waits 50 ms for a first record
    spent = transactions_for_paced_inputs(dep, running(runner), keys, gap_s=0.1)  # idle between

    # 2 s of no-op records: a deferred commit every 0.5 s at most, and the counted input's.
    assert 1 <= spent <= 7, f"{spent} transactions for 20 no-op records and 1 counted one"
    assert_counted_exactly_once(dep, "counter", keys, ignored)


@pytest.mark.kafka
@pytest.mark.parametrize("linger_ms", [0.0, 400.0])
def test_a_lingering_runner_commits_records_arriving_apart_together(
    kafka_bootstrap: str,
    tmp_path: Path,
    running: Callable[[KafkaRunner], Running],
    linger_ms: float,
) -> None:
    """``batch_linger_ms`` (the audit projection's, ``worker.BATCH_LINGER_MS``): a cycle
    collects that long after its first record, so 12 records 50 ms apart take a couple of
    transactions; without it, records 250 ms apart (longer than a transaction takes, even
    on a loaded machine) take about one each. Every input still counts exactly once."""
    keys = [f"k{i % 4}" for i in range(12)]
    process = Counting()
    dep = Deployment.fresh(kafka_bootstrap, process)
    runner = dep.runner(process, tmp_path, wall_clock, batch_linger_ms=linger_ms)
    gap_s = 0.05 if linger_ms else 0.25
    spent = transactions_for_paced_inputs(dep, running(runner), keys, gap_s=gap_s)

    if linger_ms:
        assert spent <= 4, f"{spent} transactions for 12 records within 0.6 s"
    else:
        assert spent >= 6, f"{spent} transactions: records 250 ms apart were not taken apart"
    assert_counted_exactly_once(dep, "counter", keys)


# --- poison ----------------------------------------------------------------------------------


@pytest.mark.kafka
def test_poison_goes_to_the_dead_letter_topic_and_the_partition_keeps_moving(
    kafka_bootstrap: str, tmp_path: Path, running: Callable[[KafkaRunner], Running]
) -> None:
    """``malformed_event``: undecodable bytes, a service event injected through "requests"
    and a record keyed off its partition_key are dead-lettered with reason and bytes."""
    process = Counting()
    dep = Deployment.fresh(kafka_bootstrap, process)
    garbage = random.Random(1).randbytes(40)
    granted = ApprovalGranted(
        event_id="g", invocation_id="x", partition_key="a", approval_id="A",
        approval_jti="j", approver="eve", expires_at=0,
    )  # fmt: skip
    producer = make_producer(kafka_bootstrap)
    requests = dep.topics.physical("requests")
    dep.publish([proposal(0, "a")])
    producer.produce(requests, key=b"a", value=garbage)
    producer.produce(requests, key=b"a", value=CODEC.encode(granted))
    producer.produce(requests, key=b"a", value=CODEC.encode(proposal(9, "b")))  # key != "b"
    producer.flush()
    dep.publish([proposal(1, "a")])

    run = running(dep.runner(process, tmp_path, wall_clock))
    wait_for(lambda: dep.committed_inputs("counter") == 5, 60, "the partition to move past")
    run.stop()

    dead = [CODEC.decode(r.value or b"") for r in dep.read("dead-letter")]
    letters = {ev.event_id: ev for ev in dead if isinstance(ev, EventDeadLettered)}
    assert len(letters) == 3 == len(dead)
    by_offset = {ev.source_offset: ev for ev in letters.values()}
    assert sorted(by_offset) == [1, 2, 3]
    assert {ev.code for ev in letters.values()} == {"malformed_event"}
    assert {ev.source_topic for ev in letters.values()} == {"requests"}
    assert by_offset[1].original == garbage and "marker" in by_offset[1].reason
    assert by_offset[2].original == CODEC.encode(granted)
    assert "ApprovalGranted does not belong on topic requests" in by_offset[2].reason
    assert "partition_key" in by_offset[3].reason
    assert_counted_exactly_once(dep, "counter", ["a", "a"])


class Failing(Counting):
    """Raises on one event id every time, as a handler meeting an input it cannot process
    would (a deterministic failure: re-running cannot change it)."""

    def __init__(self, poison_id: str, fail_once_on: frozenset[str] = frozenset()) -> None:
        super().__init__(fail_once_on)
        self.poison_id = poison_id

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, Sequence[Output]]:
        if event.event_id == self.poison_id:
            raise OverflowError("a number the canonical form cannot represent")
        return super().handle(state, event, now_ms)


def test_a_deterministic_failure_is_dead_lettered_with_a_code_and_never_stalls(
    kafka_bootstrap: str, tmp_path: Path, running: Callable[[KafkaRunner], Running]
) -> None:
    """``adapters/failures.py`` on Kafka: a handler that always fails on one record does not
    make the runner abort and retry it forever (the partition would stall for every
    tenant). The record is dead-lettered with the reason, the caller gets a coded outcome
    (``ProposalRejected``, ``malformed_event``), the key's state is as before the record,
    and the records after it, on the same partition, are counted exactly once. A transient
    failure (an OSError) on another record is retried, not dropped."""
    process = Failing("in-2", fail_once_on=frozenset({"in-4"}))
    dep = Deployment.fresh(kafka_bootstrap, process)
    keys = ["a"] * 6
    dep.publish([proposal(i, k) for i, k in enumerate(keys)])
    run = running(dep.runner(process, tmp_path, wall_clock))
    wait_for(lambda: dep.committed_inputs("counter") == 6, 60, "the partition to move past")
    run.stop()
    assert "in-4" not in process._fail_once_on  # the transient failure did happen

    dead = [CODEC.decode(r.value or b"") for r in dep.read("dead-letter")]
    letters = {e.event_id: e for e in dead if isinstance(e, EventDeadLettered)}
    assert len(letters) == 1
    (letter,) = letters.values()
    assert (letter.code, letter.invocation_id) == ("malformed_event", "inv-2")
    assert "OverflowError" in letter.reason and letter.original == CODEC.encode(proposal(2, "a"))
    answers = [CODEC.decode(r.value or b"") for r in dep.read("events")]
    rejected = {e.event_id: e for e in answers if isinstance(e, ProposalRejected)}
    assert [(e.invocation_id, e.code) for e in rejected.values()] == [("inv-2", "malformed_event")]
    # counted: every record but in-2, in order, state untouched by the failed one
    changelog = read_committed_changelog(dep.bootstrap, dep.topics, "counter")
    assert {k: int(v) for k, v in changelog.states.items()} == {"a": 5}


# --- timers ----------------------------------------------------------------------------------


@pytest.mark.kafka
def test_timers_fire_once_when_due(
    kafka_bootstrap: str, tmp_path: Path, running: Callable[[KafkaRunner], Running]
) -> None:
    now = [5_000]
    process = Expiring()
    dep = Deployment.fresh(kafka_bootstrap, process)
    dep.publish([proposal(0, "a", occurred_at=5_000), proposal(1, "b", occurred_at=7_000)])

    def expired() -> list[str]:
        return [CODEC.decode(r.value or b"").event_id for r in dep.read("events")]

    run = running(dep.runner(process, tmp_path, lambda: now[0]))
    wait_for(lambda: dep.committed_inputs("expiring") == 2, 60, "inputs committed")
    time.sleep(0.3)
    assert expired() == []
    now[0] = 6_500
    wait_for(lambda: expired() == ["exp-inv-0"], 10, "the first timer")
    now[0] = 60_000
    wait_for(lambda: len(expired()) == 2, 10, "the second timer")
    time.sleep(0.3)
    run.stop()
    assert sorted(expired()) == ["exp-inv-0", "exp-inv-1"]
    assert read_committed_changelog(kafka_bootstrap, dep.topics, "expiring").states == {
        "a": b"",
        "b": b"",
    }


# --- taking ownership: recover, fencing ---------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.parametrize("batch_size", [200, 1], ids=["one-batch", "a-batch-per-key"])
def test_recover_runs_for_every_restored_key_before_new_input(
    kafka_bootstrap: str,
    tmp_path: Path,
    running: Callable[[KafkaRunner], Running],
    batch_size: int,
) -> None:
    """Recovery reads the stored keys lazily, ``batch_size`` keys per transaction."""
    process = Recovering()
    dep = Deployment.fresh(kafka_bootstrap, process)
    dep.publish([proposal(i, k) for i, k in enumerate("abcabc")])
    first = running(dep.runner(process, tmp_path, wall_clock))
    wait_for(lambda: dep.committed_inputs(process.name) == 6, 60, "first inputs committed")
    first.stop()
    dep.publish([proposal(6 + i, k) for i, k in enumerate("abc")])  # arrives while down

    second = running(dep.runner(Recovering(), tmp_path, wall_clock, batch_size))
    wait_for(lambda: dep.committed_inputs(process.name) == 9, 60, "new inputs committed")
    second.stop()

    # Per partition in offset order (each key lives on one partition). Not filtered by
    # committed token: a recover transaction writes no state, so the changelog does not
    # name it; nothing aborts here, and a leftover copy would fail the "once" check.
    order = [CODEC.decode(r.value or b"").event_id for r in dep.read("events")]
    reports = [e for e in order if e.startswith("rec-")]
    assert sorted(reports) == ["rec-a-2", "rec-b-2", "rec-c-2"]  # once per key, none at first
    for i, key in enumerate("abc"):
        assert order.index(f"rec-{key}-2") < order.index(f"out-in-{6 + i}")


@pytest.mark.kafka
def test_a_fenced_runner_exits_and_its_successor_loses_nothing(
    kafka_bootstrap: str, tmp_path: Path, running: Callable[[KafkaRunner], Running]
) -> None:
    """Same instance id, same ``transactional.id``: the newer runner fences the older one,
    which must stop rather than go on committing (zombie fencing)."""
    keys = [f"k{i % 5}" for i in range(200)]
    process = Counting()
    dep = Deployment.fresh(kafka_bootstrap, process)
    dep.publish([proposal(i, k) for i, k in enumerate(keys[:100])])
    old = running(dep.runner(process, tmp_path / "old", wall_clock))
    wait_for(lambda: dep.committed_inputs("counter") == 100, 60, "first inputs committed")

    successor = dep.runner(Counting(), tmp_path / "new", wall_clock)
    new = running(successor)
    # The successor's start fences the old producer at once; the old runner finds out at its
    # next transaction, once the new inputs are there. They are published only after the
    # rebalance the successor's join began has completed, so that the fenced runner meets
    # them in the successor's group, not in a rebalance.
    wait_for(lambda: owns_partitions(successor), 120, "the successor's first assignment")
    dep.publish([proposal(100 + i, k) for i, k in enumerate(keys[100:])])
    wait_for(lambda: not old.thread.is_alive(), 60, "the fenced runner to exit")
    assert isinstance(old.error, ProducerFenced), old.error  # recognised, on both brokers
    wait_for(lambda: dep.committed_inputs("counter") == 200, 120, "all inputs committed")
    new.stop()
    assert_counted_exactly_once(dep, "counter", keys)


def owns_partitions(runner: KafkaRunner) -> bool:
    """Whether ``runner`` (on its own thread) owns a partition yet."""
    try:
        return bool(runner.owned_partitions)
    except RuntimeError:  # its partition map changed while read: it is taking ownership
        return False


@pytest.mark.kafka
def test_a_rebalance_that_never_completes_is_reported(
    kafka_broker: Broker,
    tmp_path: Path,
    running: Callable[[KafkaRunner], Running],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The group's leader leaves while the runner's join is in progress. Apache Kafka
    completes the rebalance without it: the runner gets every partition and warns of
    nothing (a broker that kept the departed leader would leave it unassigned: then the
    runner warns, once, that its group has assigned it nothing)."""
    dep = Deployment.fresh(kafka_broker.bootstrap, Counting())
    leader = make_consumer(
        kafka_broker.bootstrap, dep.topics.group("counter"), **FAST_GROUP_SETTINGS
    )
    assigned: list[TopicPartition] = []
    leader.subscribe(
        [dep.topics.physical("requests")], on_assign=lambda _c, tps: assigned.extend(tps)
    )
    deadline = time.monotonic() + 60
    while not assigned and time.monotonic() < deadline:
        leader.poll(0.1)
    assert len(assigned) == PARTITIONS, "the first member got every partition"

    runner = dep.runner(Counting(), tmp_path, wall_clock, join_overdue_s=10)
    caplog.set_level(logging.WARNING, logger="callgate.adapters.kafka.consumer")
    running(runner)
    # The leader does not poll, so it never rejoins: the runner's join stays in progress.
    time.sleep(3)
    leader.close()  # leaves the group in the middle of the rebalance

    def reports() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "no partitions assigned" in r.getMessage()]

    def overdue() -> bool:
        return bool(reports())

    wait_for(lambda: owns_partitions(runner), 60, "the runner's assignment")
    time.sleep(12)  # past join_overdue_s
    assert runner.owned_partitions == list(range(PARTITIONS))
    assert not overdue()


# --- kill -9 -----------------------------------------------------------------------------------


def start_worker(dep: Deployment, state_dir: Path) -> subprocess.Popen[bytes]:
    # REPO: SlowCounting's module imports tests.toys
    paths = [REPO, REPO / "services", REPO / "projections", Path(__file__).parent]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    cmd = [
        sys.executable, "-m", "tests.kafka_runner_main",
        "--process", "test_kafka_runner:SlowCounting",
        "--bootstrap-servers", dep.bootstrap, "--instance-id", "w1",
        "--state-dir", str(state_dir), "--prefix", dep.topics.prefix,
        "--partitions", str(PARTITIONS), "--batch-size", "50", "--batch-timeout-ms", "50",
        *[f"-X{k}={v}" for k, v in FAST_GROUP_SETTINGS.items()],
    ]  # fmt: skip
    return subprocess.Popen(cmd, env=env, cwd=REPO, stderr=subprocess.DEVNULL)


def forge_aborted_changelog_transaction(dep: Deployment, process: str, keys: set[str]) -> None:
    """Bogus state in an aborted transaction, shaped like the runner's own records. The
    restore reads uncommitted (``state``), so it sees it: the token chain must skip it."""
    producer = make_producer(dep.bootstrap, transactional_id=f"{dep.topics.prefix}.forger")
    producer.init_transactions(10)
    producer.begin_transaction()
    headers: list[tuple[str, str | bytes | None]] = [(HEADER_TXN, b"forged"), (HEADER_PREV, b"")]
    for partition in range(PARTITIONS):
        for key in keys:
            producer.produce(
                dep.topics.changelog(process), key=key.encode(), value=b"999999",
                partition=partition, headers=headers,
            )  # fmt: skip
    producer.flush()
    producer.abort_transaction()


@pytest.mark.kafka
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """kill -9 the runner process three times mid-stream; the last restart has lost its
    rocksdict and restores from the changelog, past a forged aborted transaction.

    The forged records are for keys ("n*") that first get input in the last stage, after
    a committed transaction has moved the changelog bound past them: a restore that
    applied them would start those keys at 999999 and the counts would show it.
    """
    rng = random.Random(0xCA11)
    process = SlowCounting()
    dep = Deployment.fresh(kafka_bootstrap, process)
    keys = [f"k{rng.randrange(30)}" for _ in range(900)]
    keys += [rng.choice([f"k{rng.randrange(30)}", f"n{rng.randrange(5)}"]) for _ in range(300)]
    stages = [keys[:300], keys[300:600], keys[600:900], keys[900:]]
    published = 0
    at_kill: list[int] = []
    published_at_kill: list[int] = []
    for stage in stages[:3]:
        dep.publish([proposal(published + i, k) for i, k in enumerate(stage)])
        published += len(stage)
        worker = start_worker(dep, tmp_path)
        dep.wait_for_progress(process.name, since=dep.committed_inputs(process.name))
        time.sleep(rng.uniform(0.0, 0.25))
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=10) == -signal.SIGKILL
        at_kill.append(dep.committed_inputs(process.name))
        published_at_kill.append(published)
        if len(at_kill) == 2:
            forge_aborted_changelog_transaction(dep, process.name, set(keys))

    dep.publish([proposal(published + i, k) for i, k in enumerate(stages[3])])
    # lost local state: restore from the changelog (``worker.kafka_state_dir``'s layout)
    shutil.rmtree(tmp_path / "kafka-state" / "w1" / process.name)
    worker = start_worker(dep, tmp_path)
    wait_for(lambda: dep.committed_inputs(process.name) == len(keys), 90, "all committed")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0

    assert all(n > 0 for n in at_kill) and at_kill == sorted(at_kill), at_kill
    # At least one kill landed while that stage's input was still being processed.
    assert any(n < p for n, p in zip(at_kill, published_at_kill, strict=True)), at_kill
    leftovers = assert_counted_exactly_once(dep, process.name, keys)
    print(f"kills at committed={at_kill}, aborted leftovers seen: {leftovers}")


# --- the changelog chain, without a broker ----------------------------------------------------


@dataclass(frozen=True)
class History:
    """One changelog partition as runners and zombies write it, with the oracle's answers."""

    entries: list[ChangelogEntry]  # below the committed bound
    cuts: list[tuple[int, str, dict[str, bytes]]]  # (store offset, head, state) per commit
    committed: dict[str, bytes]


@st.composite
def histories(draw: st.DrawFn) -> History:
    """The runner's transactions are sequential (commits link to the previous commit,
    aborted attempts too); zombie transactions (stale or foreign ``prev``) interleave
    anywhere. Records after the last commit are beyond the bound and never read."""
    head = ""
    runner_log: list[tuple[str, str, str, bytes, bool]] = []  # token, prev, key, value, ok
    zombies: list[list[tuple[str, str, str, bytes, bool]]] = []
    for t in range(draw(st.integers(0, 10))):
        token, kind = f"t{t}", draw(st.sampled_from(["commit", "abort", "zombie"]))
        prev = head if kind != "zombie" else draw(st.sampled_from(["", "zz", head]))
        writes = draw(st.dictionaries(st.sampled_from("abcde"), st.binary(max_size=2), min_size=1))
        records = [(token, prev, k, v, kind == "commit") for k, v in writes.items()]
        if kind == "zombie":
            zombies.append(records)
        else:
            runner_log += records
        if kind == "commit":
            head = token
    log = list(runner_log)
    for records in zombies:
        spots = sorted(draw(st.lists(st.integers(0, len(log)), min_size=len(records),
                                     max_size=len(records))))  # fmt: skip
        for shift, (spot, record) in enumerate(zip(spots, records, strict=True)):
            log.insert(spot + shift, record)
    entries = [ChangelogEntry(i, k, v, tok, prev) for i, (tok, prev, k, v, _) in enumerate(log)]
    cuts: list[tuple[int, str, dict[str, bytes]]] = []
    state: dict[str, bytes] = {}
    for i, (token, _, key, value, ok) in enumerate(log):
        if ok:
            state = {**state, key: value}
            last = max(j for j, rec in enumerate(log) if rec[0] == token)
            if i == last:
                cuts.append((i + 1, token, state))
    bound = cuts[-1][0] if cuts else 0
    return History(entries[:bound], cuts, state if cuts else {})


@settings(max_examples=300, deadline=None)
@given(history=histories(), pick=st.integers(0, 10))
def test_restore_applies_exactly_the_committed_transactions(history: History, pick: int) -> None:
    """The token chain in ``state``: records of aborted and zombie transactions are
    never applied, restoring from offset 0 or from a local store at any commit."""
    valid, _ = select_committed(history.entries, "", full=True)
    assert _fold(valid) == history.committed
    if history.cuts:
        offset, head, state = history.cuts[pick % len(history.cuts)]
        rest = [e for e in history.entries if e.offset >= offset]
        valid, _ = select_committed(rest, head, full=False)
        assert {**state, **_fold(valid)} == history.committed


def _fold(entries: Sequence[ChangelogEntry]) -> dict[str, bytes]:
    return {e.key: e.value or b"" for e in entries}
