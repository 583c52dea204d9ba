"""The embedded runner: executes ``callgate.process.Process`` implementations over the store.

One set of processes, two runners (DESIGN "Backends"): this one reads the SQLite log instead
of Kafka topics and commits to the same database. Exactly-once per process comes from
storage, as in the ``eventsourcing`` library: the input position is written in the same
transaction as everything the inputs caused, so a crash (even ``kill -9``) either loses the
whole batch (and it is read again) or none of it.

Only one runner may execute processes over one state directory at a time, because the
executor calls providers and two runners would both reconcile one execution. The guard is an
OS file lock on ``<state_dir>/runner.lock`` that the kernel drops when its holder dies.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from callgate.adapters.avro_codec import MalformedEvent
from callgate.adapters.embedded.store import (
    EmbeddedStore,
    EventCodec,
    LogRow,
    NewRow,
    StoreTx,
    event_row,
)
from callgate.codes import Code
from callgate.events import Event, EventDeadLettered
from callgate.process import Output, Process, ViewRecord

LOCK_FILE = "runner.lock"


class RunnerLockNotHeld(RuntimeError):
    """A runner tried to execute processes without holding the state directory's lock."""


class _Batch:
    """What one transaction of one process produces: key states, log rows, view records.

    States are cached per key for the batch; on ``write`` only keys whose dumped state
    differs from what is stored (or from the initial state, for new keys) are written, so
    stateless projections cost no state writes.
    """

    __slots__ = ("committed", "handled", "process", "rows", "states", "stored", "views")

    def __init__(self, process: Process[Any]) -> None:
        self.process = process
        self.states: dict[str, Any] = {}
        self.stored: dict[str, bytes | None] = {}
        self.rows: list[NewRow] = []
        self.views: list[ViewRecord] = []
        self.committed: dict[str, list[Event]] = {}
        self.handled: dict[str, list[Event]] = {}

    def load(self, tx: StoreTx, keys: Sequence[str]) -> None:
        missing = [k for k in dict.fromkeys(keys) if k not in self.stored]
        found = tx.load_states(self.process.name, missing)
        for key in missing:
            blob = found.get(key)
            self.stored[key] = blob
            self.states[key] = (
                self.process.load_state(blob) if blob is not None else self.process.initial_state()
            )

    def reset(self, key: str, now: int) -> None:
        """Undo a failed ``handle`` (it may have changed the state in place before raising):
        back to the stored state, then re-apply this batch's earlier events of the key.
        ``handle`` is deterministic, so their outputs (already kept) are not emitted again."""
        blob = self.stored[key]
        state = self.process.load_state(blob) if blob is not None else self.process.initial_state()
        for event in self.handled.get(key, ()):
            state, _ = self.process.handle(state, event, now)
        self.states[key] = state

    def seed(self, key: str, state: Any, blob: bytes | None) -> None:
        self.states[key] = state
        self.stored[key] = blob

    def apply(self, key: str, state: Any, outputs: Sequence[Output], codec: EventCodec) -> None:
        self.states[key] = state
        for out in outputs:
            if isinstance(out, ViewRecord):
                self.views.append(out)
            else:
                self.rows.append(event_row(out, codec.encode(out)))
                self.committed.setdefault(key, []).append(out)

    def changes(self, initial_blob: bytes) -> list[tuple[str, bytes, int | None]]:
        """``(key, blob, next_due)`` of states that differ from the stored (or initial) one."""
        process = self.process
        changed: list[tuple[str, bytes, int | None]] = []
        for key, state in self.states.items():
            blob = process.dump_state(state)
            stored = self.stored[key]
            if blob != (initial_blob if stored is None else stored):
                changed.append((key, blob, process.next_due(state)))
        return changed

    def write(self, tx: StoreTx, changes: Sequence[tuple[str, bytes, int | None]]) -> None:
        """Append the outputs, apply the view records in order, write ``changes``."""
        if self.rows:
            tx.insert(self.rows)
        if self.views:
            tx.put_views((v.view, v.key, v.value_json) for v in self.views)
        if changes:
            tx.put_states(self.process.name, changes)
        for key, blob, _ in changes:
            self.stored[key] = blob

    @property
    def emitted(self) -> bool:
        return bool(self.rows or self.views)


class EmbeddedRunner:
    """Runs processes over an ``EmbeddedStore``, exactly once per process and input event."""

    def __init__(
        self,
        store: EmbeddedStore,
        processes: Sequence[Process[Any]],
        codec: EventCodec,
        clock: Callable[[], int],
        batch_size: int = 500,
    ) -> None:
        names = [p.name for p in processes]
        if len(set(names)) != len(names):
            raise ValueError(f"process names must be unique: {names}")
        self.store = store
        self.processes = tuple(processes)
        self._codec = codec
        self._clock = clock
        self._batch_size = batch_size
        self._lock_fd: int | None = None
        self._recovered = False
        self._needs_recovery = True
        self._failed = False
        self._initial_blobs = {p.name: p.dump_state(p.initial_state()) for p in processes}

    # --- exclusivity -----------------------------------------------------------------------

    @property
    def holds_lock(self) -> bool:
        return self._lock_fd is not None

    def try_acquire(self) -> bool:
        """Take ``<state_dir>/runner.lock`` without waiting; False when another runner has it.

        The store remembers whether the previous holder stopped cleanly (``dirty``); only
        after an unclean stop (crash, kill -9, an error) does ``recover`` run on taking
        ownership. A clean stop leaves no started-but-unfinished work: ``follow_up``
        completes before control returns.
        """
        if self._lock_fd is not None:
            return True
        fd = os.open(self.store.state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        with self.store.transaction() as tx:
            self._needs_recovery = tx.meta("dirty") != "0"
            tx.set_meta("dirty", "1")
        self._failed = False
        return True

    def acquire(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the lock (polling: flock has no timeout)."""
        deadline = time.monotonic() + timeout
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def release(self) -> None:
        """Give up the lock; marks the store clean unless this runner failed while holding it."""
        if self._lock_fd is not None:
            if not self._failed:
                with self.store.transaction() as tx:
                    tx.set_meta("dirty", "0")
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None
            self._recovered = False

    def _ready(self) -> None:
        if self._lock_fd is None:
            raise RunnerLockNotHeld(f"{self.store.state_dir / LOCK_FILE} is not held")
        if not self._recovered:
            if self._needs_recovery:
                self.recover()
            self._recovered = True

    # --- one process, one transaction ------------------------------------------------------

    def step(self, process: Process[Any]) -> int:
        """Process the next batch of ``process``'s inputs; returns how many log rows it consumed.

        The commit sequence (THE exactly-once mechanism), all in one ``BEGIN IMMEDIATE``
        transaction:

        1. read the process's position and the next ``batch_size`` rows of its input topics
           after it;
        2. decode each row; a row that does not decode, or whose event type does not belong
           on its topic, is dead-lettered (``malformed_event``, with reason and original
           bytes, once per row however many processes read it) and skipped: poison input
           never stops the stream;
        3. load the states of the batch's keys, fold ``handle`` over the events in log order;
        4. append output events to the log (topic = the event class's ``TOPIC``), upsert or
           delete view records, write changed states with their ``next_due``;
        5. set the position to the last consumed ``seq``; COMMIT.

        Outputs, state and position become durable together or not at all. Afterwards,
        outside that transaction, ``follow_up`` runs for every key that emitted events.
        """
        self._ready()
        if not self.store.has_input(process.name, process.inputs):
            return 0  # idle: do not take SQLite's write lock from clients appending requests
        now = self._clock()
        batch = _Batch(process)
        with self.store.transaction() as tx:
            position = tx.position(process.name)
            rows = tx.fetch(process.inputs, position, self._batch_size)
            if not rows:
                return 0
            events: list[tuple[LogRow, Event]] = []
            for row in rows:
                event = self._decode(tx, row, process, now, batch)
                if event is not None:
                    events.append((row, event))
            batch.load(tx, [ev.partition_key for _, ev in events])
            for row, event in events:
                key = event.partition_key
                try:
                    state, outputs = process.handle(batch.states[key], event, now)
                except Exception as exc:  # a poison event must not stop the stream
                    batch.reset(key, now)
                    if tx.claim_dead_letter(row.topic, row.seq):
                        reason = f"{process.name} could not handle {event.event_type}: {exc!r}"
                        self._dead_letter(row, reason, process, now, batch)
                    continue
                batch.apply(key, state, outputs, self._codec)
                batch.handled.setdefault(key, []).append(event)
            batch.write(tx, batch.changes(self._initial_blobs[process.name]))
            tx.set_position(process.name, rows[-1].seq)
        self._follow_up(process, batch, now)
        return len(rows)

    def _decode(
        self, tx: StoreTx, row: LogRow, process: Process[Any], now: int, batch: _Batch
    ) -> Event | None:
        try:
            event = self._codec.decode(row.payload)
            if row.topic != type(event).TOPIC:
                # Fail closed: a client must not inject service events through "requests".
                raise MalformedEvent(f"{event.event_type} does not belong on topic {row.topic}")
        except MalformedEvent as exc:
            if tx.claim_dead_letter(row.topic, row.seq):
                self._dead_letter(row, exc.reason, process, now, batch)
            return None
        return event

    def _dead_letter(
        self, row: LogRow, reason: str, process: Process[Any], now: int, batch: _Batch
    ) -> None:
        # Deterministic id: a rebuilt log (replay) names the same dead-letter the same way.
        dead = EventDeadLettered(
            event_id=f"dead-letter-{row.topic}-{row.seq}",
            invocation_id=row.invocation_id or "",
            partition_key=row.partition_key,
            occurred_at=now,
            producer=process.name,
            code=Code.MALFORMED_EVENT.value,
            reason=reason,
            source_topic=row.topic,
            source_partition=0,
            source_offset=row.seq,
            original=row.payload,
        )
        batch.rows.append(event_row(dead, self._codec.encode(dead)))

    def _follow_up(self, process: Process[Any], batch: _Batch, now: int) -> None:
        """Give each key that emitted events its ``follow_up``, now that they are durable.

        Its outputs and state are committed in one further transaction per round; if that
        round emitted events, ``follow_up`` runs again for them, until a round emits none.
        A crash between the commits loses no input: the executor's ``recover`` finds the
        started-but-unfinished work on restart (C12).
        """
        initial_blob = self._initial_blobs[process.name]
        while batch.committed:
            nxt = _Batch(process)
            for key, committed in batch.committed.items():
                nxt.seed(key, batch.states[key], batch.stored[key])
                state, outputs = process.follow_up(batch.states[key], committed, now)
                nxt.apply(key, state, outputs, self._codec)
            changes = nxt.changes(initial_blob)
            if changes or nxt.emitted:
                with self.store.transaction() as tx:
                    nxt.write(tx, changes)
            batch = nxt

    def fire_timers(self, process: Process[Any], now_ms: int | None = None) -> int:
        """Run ``due`` for up to ``batch_size`` keys whose ``next_due <= now``, in one
        transaction; returns how many of them changed state or emitted outputs."""
        self._ready()
        now = self._clock() if now_ms is None else now_ms
        if not self.store.has_due(process.name, now):
            return 0
        batch = _Batch(process)
        fired: set[str] = set()
        with self.store.transaction() as tx:
            for key, blob in tx.due_states(process.name, now, self._batch_size):
                old = process.load_state(blob)
                batch.seed(key, old, blob)
                state, outputs = process.due(old, now)
                batch.apply(key, state, outputs, self._codec)
                if outputs:
                    fired.add(key)
            changes = batch.changes(self._initial_blobs[process.name])
            batch.write(tx, changes)
        self._follow_up(process, batch, now)
        return len(fired.union(key for key, _, _ in changes))

    def recover(self) -> int:
        """Call ``recover`` once for every stored key of each process with ``recovers``.

        Runs when this runner takes ownership (first work after acquiring the lock), before
        any new input, in pages of ``batch_size`` keys; outputs commit with the state, then
        get their ``follow_up``. Keys never stored are in the initial state: nothing to do.
        """
        if self._lock_fd is None:
            raise RunnerLockNotHeld(f"{self.store.state_dir / LOCK_FILE} is not held")
        now = self._clock()
        emitted = 0
        for process in self.processes:
            if not process.recovers:
                continue
            after = ""
            while True:
                batch = _Batch(process)
                with self.store.transaction() as tx:
                    page = tx.states_after(process.name, after, self._batch_size)
                    for key, blob in page:
                        old = process.load_state(blob)
                        batch.seed(key, old, blob)
                        state, outputs = process.recover(old, now)
                        batch.apply(key, state, outputs, self._codec)
                    batch.write(tx, batch.changes(self._initial_blobs[process.name]))
                emitted += len(batch.rows)
                self._follow_up(process, batch, now)
                if len(page) < self._batch_size:
                    break
                after = page[-1][0]
        self._recovered = True
        return emitted

    # --- loops ---------------------------------------------------------------------------

    def run_once(self) -> int:
        """One round: due timers and one batch per process; returns the progress made."""
        progress = 0
        now = self._clock()
        try:
            for process in self.processes:
                progress += self.fire_timers(process, now)
                progress += self.step(process)
        except BaseException:
            self._failed = True  # the next holder must recover (see ``try_acquire``)
            raise
        return progress

    def run_until_idle(self, max_seconds: float = 30.0) -> int:
        """Run rounds until one makes no progress; raises TimeoutError past ``max_seconds``."""
        deadline = time.monotonic() + max_seconds
        total = 0
        while progress := self.run_once():
            total += progress
            if time.monotonic() > deadline:
                raise TimeoutError(f"still busy after {max_seconds}s ({total} steps)")
        return total

    def run_until(
        self, predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.01
    ) -> bool:
        """Run rounds until ``predicate()`` holds (True) or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            if not self.run_once():
                time.sleep(poll_s)
        return True

    def serve(self, stop: threading.Event, idle_sleep_s: float = 0.02) -> None:
        """Run rounds until ``stop`` is set, sleeping briefly when there is nothing to do."""
        while not stop.is_set():
            if not self.run_once():
                stop.wait(idle_sleep_s)
