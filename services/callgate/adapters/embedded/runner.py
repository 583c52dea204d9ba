"""The embedded runner: executes processes (``callgate.domain.process_port``) over the store.

One set of processes, two runners (docs/contract.md "Backends"): this one reads the SQLite log
instead
of Kafka topics and commits to the same database. Exactly-once per process comes from
storage, as in the ``eventsourcing`` library: the input position is written in the same
transaction as everything the inputs caused, so a crash (even ``kill -9``) either loses the
whole batch (and it is read again) or none of it.

Only one runner may execute processes over one state directory at a time: ``ownership``.

Throughput (ADR 0006, "Throughput"): a round (``run_once``) runs every process, in order,
in one transaction, so a round costs one commit (one fsync) plus one for its ``follow_up``
instead of one per process. And because the runner is the only writer of positions and
states while it holds the lock, it keeps two caches in memory, valid only for what has been
committed and dropped whenever anything fails or the lock changes hands:

- decoded events by ``seq``: a row is decoded once, however many processes read it (log
  rows never change once committed);
- per process, the committed state object of recently committed keys with its stored
  bytes, so a key seen again skips ``load_state``. A projection never changes a state in
  place (its states are frozen), so when it returns the very object it was given the state
  is unchanged and ``dump_state`` is skipped; every other process is dumped and compared.

Events whose type a process does not react to (``process.reacts_to``) are consumed (its
position moves past them) without loading state or calling ``handle``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from callgate.adapters.embedded.decoded_rows import DecodedRows, Poison
from callgate.adapters.embedded.full_disk import StorageObserver, serve_rounds
from callgate.adapters.embedded.ownership import Ownership
from callgate.adapters.embedded.store import (
    EmbeddedStore,
    EventCodec,
    InputRow,
    NewRow,
    StoreTx,
    event_row,
)
from callgate.adapters.engine import (
    add_dropped,
    dropped,
    fire_due,
    follow_ups,
    handle_input,
    malformed,
    reacts,
    recover_keys,
    spans_of,
)
from callgate.adapters.unit_of_work import STATE_CACHE_KEYS, Change, StateCache, UnitOfWork
from callgate.domain.events import Event
from callgate.domain.process_port import Output, Process, ViewRecord, answered_by, reacts_to
from callgate_projections import keeps_states_immutable

if TYPE_CHECKING:
    from callgate.tracing import Tracing

# Input rows per process per round: a round costs one commit (an fsync) however many rows
# it takes, so under a backlog bigger rounds are cheaper; an idle runner takes what is there.
BATCH_SIZE = 2_000
PRUNE_REQUESTS_EVERY_S = 60.0
# How often a round goes back to a process that answers before it commits (``_steps``):
# the hop to the usage process and back takes one; a call asked in that pass, one more.
PASSES_BACK = 2
# A unit of work's record: a log row, or a view record.
_Record = NewRow | ViewRecord
_Unit = UnitOfWork[str, _Record]
# (topic, event type): what a unit appended to the log (``_steps``).
_Appended = set[tuple[str, str | None]]


class EmbeddedRunner:
    """Runs processes over an ``EmbeddedStore``, exactly once per process and input event."""

    def __init__(
        self,
        store: EmbeddedStore,
        processes: Sequence[Process[Any]],
        codec: EventCodec,
        clock: Callable[[], int],
        batch_size: int = BATCH_SIZE,
        state_cache_keys: int = STATE_CACHE_KEYS,
        on_views: Callable[[Sequence[ViewRecord]], None] | None = None,
        requests_retention_ms: int | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """``on_views`` is called after each commit with the view records it made durable
        (``callgate serve`` prints a line per settled decision from the status view).
        ``requests_retention_ms``: prune consumed requests that old (``None``: keep)."""
        names = [p.name for p in processes]
        if len(set(names)) != len(names):
            raise ValueError(f"process names must be unique: {names}")
        self.store = store
        self.processes = tuple(processes)
        self._codec = codec
        self._clock = clock
        self._batch_size = batch_size
        self._on_views = on_views
        self._tracing = tracing  # spans around handle and follow_up (ADR 0036); None: off
        self._ownership = Ownership(store)
        self._recovered = False
        self._needs_recovery = True
        self._failed = False
        self._initial_blobs = {p.name: p.dump_state(p.initial_state()) for p in processes}
        self._immutable = {p.name: keeps_states_immutable(p) for p in processes}
        self._reacts_to = {p.name: reacts_to(p) for p in processes}
        # What each process answers, (topic, event type) (``_steps``).
        self._answers = {
            p.name: frozenset((t.TOPIC, t.__name__) for t in answered_by(p)) for p in processes
        }
        self._states: dict[str, StateCache[str]] = {
            p.name: StateCache(state_cache_keys) for p in processes
        }
        self._decoded = DecodedRows(codec.decode)
        self._positions: dict[str, int] = {}
        self._requests_retention_ms = requests_retention_ms
        self._request_readers = [p.name for p in processes if "requests" in p.inputs]
        self._next_prune = 0.0

    # --- caches ----------------------------------------------------------------------------

    def _forget(self) -> None:
        """Drop every cache: after a failure (a rolled-back transaction may have changed a
        cached state in place, or decoded rows whose ``seq`` will be reused) and whenever
        the lock changes hands (another runner may have moved on in between)."""
        for cache in self._states.values():
            cache.clear()
        self._decoded.clear()
        self._positions.clear()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self._forget()
            raise

    # --- exclusivity (``ownership``) --------------------------------------------------------

    @property
    def holds_lock(self) -> bool:
        return self._ownership.held

    def try_acquire(self) -> bool:
        """Take ``<state_dir>/runner.lock`` without waiting; False when another runner has
        it. After an unclean stop of the previous holder, ``recover`` runs first."""
        if self._ownership.held:
            return True
        self._forget()  # another runner may have held the lock since we last did
        dirty = self._ownership.take()
        if dirty is None:
            return False
        self._needs_recovery, self._failed = dirty, False
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
        if self._ownership.held:
            try:
                self._ownership.give_up(clean=not self._failed)
            finally:
                self._recovered = False
                self._forget()

    def _ready(self) -> None:
        self._ownership.check()
        if not self._recovered:
            if self._needs_recovery:
                self.recover()
            self._recovered = True

    # --- one process, inside a transaction ------------------------------------------------

    def step(self, process: Process[Any]) -> int:
        """Process the next batch of ``process``'s inputs in one transaction of its own;
        returns how many log rows it consumed (see ``_step`` for the commit sequence)."""
        with self._guard():
            self._ready()
            if not self.store.has_input(process.name, process.inputs):
                return 0  # idle: do not take SQLite's write lock from clients appending
            now = self._clock()
            unit = self._unit(process)
            with self.store.transaction() as tx:
                consumed = self._step(tx, unit, now, set())
            self._committed([unit])
            self._follow_up([unit], now)
        return consumed

    def _unit(self, process: Process[Any]) -> _Unit:
        codec = self._codec

        def encode(out: Output) -> _Record:
            return out if isinstance(out, ViewRecord) else event_row(out, codec.encode(out))

        name = process.name
        return UnitOfWork(
            process, encode, self._states[name], self._immutable[name], self._on_views is not None
        )

    def _changes(self, unit: _Unit) -> list[Change[str]]:
        return unit.changes(self._initial_blobs[unit.process.name])

    def _write(
        self,
        tx: StoreTx,
        unit: _Unit,
        appended: _Appended,
        changes: list[Change[str]] | None = None,
    ) -> None:
        """Append the unit's rows, apply its view records in order, write its changed
        states (``changes``, when the caller has them already); adds what it appended to
        ``appended``."""
        if changes is None:
            changes = self._changes(unit)
        rows = [r for r in unit.records if not isinstance(r, ViewRecord)]
        if rows:
            tracing, traces = self._tracing, None
            if tracing is not None:  # each traced invocation's rows carry its context on
                known = ((row[3], tracing.of(row[3])) for row in rows if row[3])
                traces = {inv: tp for inv, tp in known if inv is not None and tp is not None}
            tx.insert(rows, traces)
            appended.update((row[0], row[2]) for row in rows)
        if len(rows) < len(unit.records):
            views = (r for r in unit.records if isinstance(r, ViewRecord))
            tx.put_views((v.view, v.key, v.value_json) for v in views)
        if changes:
            tx.put_states(unit.process.name, changes)
        unit.written(changes)

    def _step(self, tx: StoreTx, unit: _Unit, now: int, appended: _Appended) -> int:
        """The next batch of ``unit.process``'s inputs, inside ``tx``; returns how many log
        rows it consumed. The commit sequence (THE exactly-once mechanism), all in the
        caller's ``BEGIN IMMEDIATE`` transaction:

        1. read the process's position and the next ``batch_size`` rows of its input topics
           after it;
        2. decode each row (once per runner, see the module docstring); a row that does not
           decode, or whose event type does not belong on its topic, is dead-lettered
           (``malformed_event``, with reason and original bytes, once per row however many
           processes read it) and skipped: poison input never stops the stream;
        3. load the states of the batch's keys, fold ``handle`` over the events in log order
           (``engine.handle_input``): a transient failure rolls the round back (it is
           retried); a deterministic one undoes that event's effect on the key's state,
           dead-letters the row with the reason and, for a client request, appends the
           caller's coded outcome (``engine.dropped``);
        4. append output events to the log (topic = the event class's ``TOPIC``), upsert or
           delete view records, write changed states with their ``next_due``;
        5. set the position to the last consumed ``seq``; the caller COMMITs.

        Outputs, state and position become durable together or not at all. Afterwards,
        outside that transaction, ``follow_up`` runs for every key that emitted events.
        """
        process = unit.process
        position = tx.position(process.name)
        rows = tx.fetch_inputs(process.inputs, position, self._batch_size)
        if not rows:
            return 0
        events: list[tuple[InputRow, Event]] = []
        wanted = self._reacts_to[process.name]
        for row in rows:
            event = self._decode(tx, row, unit, now)
            # Consumed either way (the position moves past it); ``handle`` would change
            # nothing for a type the process does not react to (``process.reacts_to``).
            if event is not None and reacts(wanted, event):
                events.append((row, event))
        unit.load([e.partition_key for _, e in events], partial(tx.load_states, process.name))
        tracing = spans_of(self._tracing, process.name)
        for row, event in events:
            key = event.partition_key

            def traceparent(row: InputRow = row, inv: str = event.invocation_id) -> str | None:
                if row[5] is None and tracing is not None and tracing.of(inv) is None:
                    # an input without a context (an approver's decision) after a restart:
                    # the invocation's earlier rows carry it
                    return tx.traceparent_of(inv)
                return row[5]

            load = partial(unit.states.__getitem__, key)
            failure = handle_input(unit, key, event, now, load, tracing, traceparent)
            if failure is not None and tx.claim_dead_letter(row[1], row[0]):
                seq, topic, _, _, payload, _ = row
                add_dropped(unit, dropped(
                    f"dead-letter-{topic}-{seq}", (topic, 0, seq), payload, event, failure,
                    process.name, now,
                ))  # fmt: skip
        self._write(tx, unit, appended)
        tx.set_position(process.name, rows[-1][0])
        return len(rows)

    def _decode(self, tx: StoreTx, row: InputRow, unit: _Unit, now: int) -> Event | None:
        seq, topic, partition_key, invocation_id, payload, _ = row
        decoded = self._decoded.get(seq, topic, payload)
        if isinstance(decoded, Poison):
            # Deterministic id: a rebuilt log (replay) names the same dead-letter the same way.
            if tx.claim_dead_letter(topic, seq):
                unit.add([malformed(
                    f"dead-letter-{topic}-{seq}", (topic, 0, seq), payload,
                    (invocation_id or "", partition_key), unit.process.name, decoded.reason, now,
                )])  # fmt: skip
            return None
        return decoded

    def _committed(self, units: Sequence[_Unit]) -> None:
        """After the commit of ``units``: their states are the committed ones."""
        for unit in units:
            unit.committed()
        if self._on_views is not None:
            for unit in units:
                if unit.views:
                    written, unit.views = unit.views, []
                    self._on_views(written)

    def _follow_up(self, units: Sequence[_Unit], now: int) -> None:
        """Give each key that emitted events its ``follow_up``, now that they are durable
        (``engine.follow_ups``): each round's outputs and states, of every process in
        ``units`` in process order, commit in one further transaction."""

        def commit(nexts: Sequence[_Unit]) -> None:
            work = [(u, self._changes(u)) for u in nexts]
            if any(u.pending or changes for u, changes in work):
                with self.store.transaction() as tx:
                    for nxt, changes in work:
                        self._write(tx, nxt, set(), changes)
            self._committed(nexts)

        try:
            follow_ups(units, lambda done: self._unit(done.process), commit, now, self._tracing)
        except BaseException:
            # Work started by the commit may be unfinished (a provider called, its outcome
            # not written): before new input, ``recover`` finds it, as after a restart.
            self._recovered = False
            self._needs_recovery = True
            raise

    def fire_timers(self, process: Process[Any], now_ms: int | None = None) -> int:
        """Run ``due`` for up to ``batch_size`` keys whose ``next_due <= now``, in one
        transaction; returns how many of them changed state or emitted outputs."""
        with self._guard():
            self._ready()
            now = self._clock() if now_ms is None else now_ms
            if not self.store.has_due(process.name, now):
                return 0
            unit = self._unit(process)
            with self.store.transaction() as tx:
                fired = self._fire(tx, unit, now, set())
            self._committed([unit])
            self._follow_up([unit], now)
        return fired

    def _fire(self, tx: StoreTx, unit: _Unit, now: int, appended: _Appended) -> int:
        """``due`` for up to ``batch_size`` due keys inside ``tx``, written; returns how many
        keys fired or changed. ``unit`` must be new: its inputs come after (``run_once``)."""
        name = unit.process.name
        due = tx.due_states(name, now, self._batch_size)
        if not due:
            return 0
        found = dict(due)
        fired = fire_due(unit, found, lambda keys: found, now, self._batch_size)
        changes = self._changes(unit)
        self._write(tx, unit, appended, changes)
        return len(fired.union(key for key, _, _ in changes))

    def recover(self) -> int:
        """Call ``recover`` once for every stored key of each process with ``recovers``.

        Runs when this runner takes ownership (first work after acquiring the lock), before
        any new input, in pages of ``batch_size`` keys; outputs commit with the state, then
        get their ``follow_up``. Keys never stored are in the initial state: nothing to do.
        """
        self._ownership.check()
        now = self._clock()
        emitted = 0
        with self._guard():
            for process in self.processes:
                if not process.recovers:
                    continue
                after = ""
                while True:
                    unit = self._unit(process)
                    with self.store.transaction() as tx:
                        page = tx.states_after(process.name, after, self._batch_size)
                        recover_keys(unit, page, now)
                        emitted += sum(not isinstance(r, ViewRecord) for r in unit.records)
                        self._write(tx, unit, set())
                    self._committed([unit])
                    self._follow_up([unit], now)
                    if len(page) < self._batch_size:
                        break
                    after = page[-1][0]
        self._recovered = True
        return emitted

    # --- loops ---------------------------------------------------------------------------

    def _has_work(self, now: int) -> bool:
        """Lock-free idle check: do not take SQLite's write lock when there is nothing to do
        (clients appending requests would wait for it)."""
        store = self.store
        return any(
            store.has_input(p.name, p.inputs) or store.has_due(p.name, now) for p in self.processes
        )

    def run_once(self) -> int:
        """One round: due timers and one batch per process, all in one transaction (one
        fsync for the whole round), then the ``follow_up`` of what it committed; returns
        the progress made (timers fired and log rows consumed).

        Processes run in order inside the transaction, each seeing what the ones before it
        appended (and, going back, what the asking one appended for one that answers:
        ``_steps``), exactly as if each had committed on its own: the outputs are the same. A
        key's ``follow_up`` gets what its timers and its inputs emitted in the round at once.
        """
        try:
            with self._guard():
                self._ready()
                now = self._clock()
                if not self._has_work(now):
                    self._prune_requests()
                    return 0
                progress = 0
                units = [self._unit(process) for process in self.processes]
                with self.store.transaction() as tx:
                    progress += self._steps(tx, units, now)
                    for process in self.processes:
                        self._positions[process.name] = tx.position(process.name)
                self._committed(units)
                self._follow_up(units, now)
                every = len(self._positions) == len(self.processes)
                self._decoded.prune(self._positions.values() if every else ())
                self._prune_requests()
        except BaseException:
            self._failed = True  # the next holder must recover (see ``try_acquire``)
            raise
        return progress

    def _steps(self, tx: StoreTx, units: Sequence[_Unit], now: int) -> int:
        """Each process's due timers and one batch of its inputs, in order, in the round's
        transaction. When a process appends what one before it answers (the invocations
        asking a limit's usage, ADR 0079: ``callgate.domain.process_port.answered_by``), the round
        goes back to that one at once and on in order from there, so the asking process
        takes the answer before the processes after it (the projections) run. At most
        ``PASSES_BACK`` times; what is left waits for the next round. The outputs are those
        of the rounds this saves (the same inputs in the same order per process), without
        their commits."""
        progress, back, at, reached = 0, 0, 0, -1
        while at < len(units):
            unit, asked = units[at], set[tuple[str, str | None]]()
            if at > reached:  # the first time this round: its timers first, then its inputs
                progress += self._fire(tx, unit, now, asked)
                reached = at
            progress += self._step(tx, unit, now, asked)
            earlier = next(
                (i for i, u in enumerate(units[:at]) if self._answers[u.process.name] & asked),
                None,
            )
            if earlier is not None and back < PASSES_BACK:
                back, at = back + 1, earlier
            else:
                at += 1
        return progress

    def _prune_requests(self) -> None:
        """Drop the requests every reader consumed that are older than the retention (they
        hold bearer tokens; ADR 0016): at most every ``PRUNE_REQUESTS_EVERY_S``, or a tenth
        of the retention when that is shorter (every round for a retention of 0)."""
        retention = self._requests_retention_ms
        if retention is None or time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + min(PRUNE_REQUESTS_EVERY_S, retention / 10_000)
        self.store.prune_requests(self._request_readers, retention)

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

    def serve(
        self,
        stop: threading.Event,
        idle_sleep_s: float = 0.02,
        storage: StorageObserver | None = None,
    ) -> None:
        """Run rounds until ``stop`` is set, sleeping briefly when there is nothing to do,
        and waiting out a disk that refuses them (``full_disk``, ADR 0084)."""
        serve_rounds(self.run_once, self.store.probe_write, stop, idle_sleep_s, storage)
