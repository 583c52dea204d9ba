"""``serve``'s runner on a store that fills up, and then has room again (ADR 0084).

The store here is the embedded store with SQLite's own page limit switched on and off
(``PRAGMA max_page_count`` at the size the file has): while it is on, a write that needs a
new page fails with SQLITE_FULL, as on a full disk. Toy processes (``tests.toys``) stand in
for the deciders; what is under test is the runner: a refused round rolls back whole and is
tried again, serve goes on by itself once writes succeed, and work that a refused follow-up
left unfinished is recovered once, as after a restart. ``tests/integration/test_disk_full.py``
does the same on a real full filesystem.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.toys import Counting, Toy, proposal

from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.embedded.runner import EmbeddedRunner
from callgate.adapters.embedded.store import EmbeddedStore
from callgate.domain.events import Event, ExecutionStarted, ExecutionUncertain
from callgate.domain.process_port import Output

CODEC = AvroCodec.default()
NO_LIMIT = 2**30


class FillingStore(EmbeddedStore):
    """The embedded store whose file may not grow while ``full`` is set (SQLITE_FULL)."""

    full = False

    def _conn(self) -> Any:
        conn = super()._conn()
        if self.full:
            (pages,) = conn.execute("PRAGMA page_count").fetchone()
            conn.execute(f"PRAGMA max_page_count = {pages}")
        else:
            conn.execute(f"PRAGMA max_page_count = {NO_LIMIT}")
        return conn


class Told:
    """A ``StorageObserver`` that keeps what serve told it."""

    def __init__(self) -> None:
        self.refusals: list[str] = []
        self.resumptions: list[int] = []

    def refused(self, reason: str, attempt: int, retry_in_s: float) -> None:
        self.refusals.append(reason)

    def resumed(self, attempts: int, seconds: float) -> None:
        self.resumptions.append(attempts)


class Executing(Toy[list[str]]):
    """Starts one execution per proposal (state: the tokens started and not finished); its
    ``follow_up`` calls the "provider", during which ``during_call`` may fill the disk, and
    reports the execution; ``recover`` reports what is still started as uncertain, as the
    executor reconciles started work (C12)."""

    name = "executing"
    inputs = frozenset({"requests"})
    recovers = True

    def __init__(self, during_call: Callable[[], None]) -> None:
        self.during_call = during_call
        self.calls = 0

    def initial_state(self) -> list[str]:
        return []

    def handle(
        self, state: list[str], event: Event, now_ms: int
    ) -> tuple[list[str], Sequence[Output]]:
        started = ExecutionStarted(
            event_id=f"started-{event.event_id}",
            invocation_id=event.invocation_id,
            partition_key=event.partition_key,
            execution_token=event.event_id,
            attempt=1,
        )
        return [*state, event.event_id], [started]

    def follow_up(
        self, state: list[str], committed: Sequence[Event], now_ms: int
    ) -> tuple[list[str], Sequence[Output]]:
        done: list[Output] = []
        for started in committed:
            if isinstance(started, ExecutionStarted):
                self.calls += 1
                self.during_call()
                done.append(self._report(started, "executed", "done"))
        tokens = {e.execution_token for e in committed if isinstance(e, ExecutionStarted)}
        return [t for t in state if t not in tokens], done

    def recover(self, state: list[str], now_ms: int) -> tuple[list[str], Sequence[Output]]:
        reports = [self._report(ExecutionStarted(
            event_id=token, invocation_id="", partition_key="k", execution_token=token, attempt=1
        ), "recovered", "recovered") for token in state]  # fmt: skip
        return [], reports

    @staticmethod
    def _report(started: ExecutionStarted, reason: str, prefix: str) -> ExecutionUncertain:
        return ExecutionUncertain(
            event_id=f"{prefix}-{started.execution_token}",
            invocation_id=started.invocation_id,
            partition_key=started.partition_key,
            execution_token=started.execution_token,
            reason=reason + " " + "." * 10_000,  # on pages of its own: a full store refuses it
        )

    def dump_state(self, state: list[str]) -> bytes:
        return json.dumps(state).encode()

    def load_state(self, data: bytes) -> list[str]:
        loaded: list[str] = json.loads(data)
        return loaded


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FillingStore]:
    s = FillingStore(tmp_path, CODEC)
    yield s
    s.close()


def serving(store: EmbeddedStore, *processes: Any) -> tuple[Told, Callable[[], None]]:
    """A runner serving ``processes`` in a thread, and what stops it (asserting that it was
    still running: nothing ended it on its own)."""
    runner = EmbeddedRunner(store, processes, CODEC, lambda: 1_000, batch_size=500)
    assert runner.try_acquire()
    told, stop = Told(), threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            runner.serve(stop, storage=told)
        except BaseException as exc:  # pragma: no cover - reported below
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def stopped() -> None:
        assert thread.is_alive() and not failed, failed
        stop.set()
        thread.join(10)
        runner.release()

    return told, stopped


def until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def outputs(store: EmbeddedStore) -> list[Event]:
    return [CODEC.decode(row.payload) for row in store.read_log("events", limit=1_000_000)]


def test_a_full_store_holds_serve_back_and_it_goes_on_by_itself(store: FillingStore) -> None:
    store.full = True
    with pytest.raises(sqlite3.OperationalError, match="full"):  # a client's append
        store.append([proposal(i, "k" * 2_000) for i in range(1_000)])
    assert store.last_seq() == 0  # nothing of it was recorded
    store.full = False
    store.append([proposal(i, f"k{i % 5}") for i in range(1_000)])
    store.full = True
    told, stop = serving(store, Counting())
    until(lambda: len(told.refusals) >= 3)
    assert store.backlog("counter", {"requests"}) == 1_000  # no refused round left anything
    store.full = False
    until(lambda: store.backlog("counter", {"requests"}) == 0)
    stop()
    assert told.refusals[0] == "SQLITE_FULL: database or disk is full"
    assert told.resumptions == [len(told.refusals)]  # one outage, told once it was over
    started = [e.event_id for e in outputs(store) if isinstance(e, ExecutionStarted)]
    assert sorted(started) == sorted(f"out-in-{i}" for i in range(1_000))  # each once


def test_work_a_refused_follow_up_left_unfinished_is_recovered_once(store: FillingStore) -> None:
    def fill_on_the_first_call() -> None:
        if executing.calls == 1:
            store.full = True  # the disk fills while the provider works

    executing = Executing(fill_on_the_first_call)
    told, stop = serving(store, executing)
    store.append([proposal(0, "k")])
    until(lambda: bool(told.refusals))
    assert store.backlog("executing", {"requests"}) == 0  # the input's round was committed
    assert [e.event_id for e in outputs(store)] == ["started-in-0"]  # its report was not
    store.full = False
    until(lambda: len(outputs(store)) == 2)
    store.append([proposal(1, "k")])
    until(lambda: len(outputs(store)) == 4)
    stop()
    assert [e.event_id for e in outputs(store)] == [
        "started-in-0",
        "recovered-in-0",  # reconciled before new input, once
        "started-in-1",
        "done-in-1",
    ]
    assert told.resumptions == [len(told.refusals)]
    assert executing.calls == 2
