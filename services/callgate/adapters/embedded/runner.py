"""The embedded runner: executes processes (``callgate.domain.process_port``) over the store.

One set of processes, two runners (docs/contract.md "Backends"): this one reads the SQLite
log instead of Kafka topics and commits to the same database. Exactly-once per process comes
from storage, as in the ``eventsourcing`` library: the input position is written in the same
transaction as everything the inputs caused, so a crash (even ``kill -9``) either loses the
whole batch (and it is read again) or none of it.

Only one runner may execute processes over one state directory at a time: ``ownership``.

Throughput (ADR 0006, "Throughput"): a round (``run_once``) runs every process, in order
(``round_order``), in one transaction, so a round costs one commit (one fsync) plus one for
its ``follow_up`` instead of one per process. And because the runner is the only writer of
positions and states while it holds the lock, it keeps caches in memory (``caches``).

Events whose type a process does not react to (``process.reacts_to``) are consumed (its
position moves past them) without loading state or calling ``handle``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from callgate.adapters import engine
from callgate.adapters.embedded.caches import RunnerCaches
from callgate.adapters.embedded.loops import RoundLoops
from callgate.adapters.embedded.ownership import Ownership, wait_for
from callgate.adapters.embedded.request_retention import RequestRetention
from callgate.adapters.embedded.round_order import answers_of, in_answer_order
from callgate.adapters.embedded.store import EmbeddedStore, EventCodec, InputRow, StoreTx, event_row
from callgate.adapters.embedded.unit_writes import Appended, Record, Unit, write_unit
from callgate.adapters.unit_of_work import STATE_CACHE_KEYS, Change, UnitOfWork
from callgate.domain.events import Event
from callgate.domain.process_port import Output, Process, ViewRecord, reacts_to
from callgate_projections import keeps_states_immutable

if TYPE_CHECKING:
    from callgate.tracing import Tracing

# Input rows per process per round: a round costs one commit (an fsync) however many rows
# it takes, so under a backlog bigger rounds are cheaper; an idle runner takes what is there.
BATCH_SIZE = 2_000


class EmbeddedRunner(RoundLoops):
    """Runs processes over an ``EmbeddedStore``, exactly once per process and input event;
    ``RoundLoops`` repeats its rounds."""

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
        self._initial_blobs = {p.name: p.dump_state(p.initial_state()) for p in processes}
        self._immutable = {p.name: keeps_states_immutable(p) for p in processes}
        self._reacts_to = {p.name: reacts_to(p) for p in processes}
        self._answers = {p.name: answers_of(p) for p in processes}  # (``round_order``)
        self._caches = RunnerCaches(processes, codec.decode, state_cache_keys)
        self._requests = RequestRetention(store, processes, requests_retention_ms)

    # --- exclusivity (``ownership``) --------------------------------------------------------

    @property
    def holds_lock(self) -> bool:
        return self._ownership.held

    def try_acquire(self) -> bool:
        """Take ``<state_dir>/runner.lock`` without waiting; False when another runner has
        it. After an unclean stop of the previous holder, ``recover`` runs first."""
        if self._ownership.held:
            return True
        self._caches.forget()  # another runner may have held the lock since we last did
        return self._ownership.try_take()

    def acquire(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the lock (polling: flock has no timeout)."""
        return wait_for(self.try_acquire, timeout)

    def release(self) -> None:
        """Give up the lock; marks the store clean unless this runner failed while holding it."""
        if self._ownership.held:
            try:
                self._ownership.release()
            finally:
                self._caches.forget()

    def _ready(self) -> None:
        self._ownership.ready(self.recover)

    # --- one process, inside a transaction ------------------------------------------------

    def step(self, process: Process[Any]) -> int:
        """Process the next batch of ``process``'s inputs in one transaction of its own;
        returns how many log rows it consumed (see ``_step`` for the commit sequence)."""
        with self._caches.guard():
            self._ready()
            if not self.store.has_input(process.name, process.inputs):
                return 0  # idle: do not take SQLite's write lock from clients appending
            return self._alone(process, self._clock(), self._step)

    def _alone(
        self, process: Process[Any], now: int, work: Callable[[StoreTx, Unit, int, Appended], int]
    ) -> int:
        """``work`` for ``process`` in a transaction of its own, then its follow-ups."""
        unit = self._unit(process)
        with self.store.transaction() as tx:
            done = work(tx, unit, now, set())
        self._committed([unit])
        self._follow_up([unit], now)
        return done

    def _unit(self, process: Process[Any]) -> Unit:
        codec = self._codec

        def encode(out: Output) -> Record:
            return out if isinstance(out, ViewRecord) else event_row(out, codec.encode(out))

        name, views = process.name, self._on_views is not None
        return UnitOfWork(process, encode, self._caches.states[name], self._immutable[name], views)

    def _changes(self, unit: Unit) -> list[Change[str]]:
        return unit.changes(self._initial_blobs[unit.process.name])

    def _write(
        self, tx: StoreTx, unit: Unit, appended: Appended, changes: list[Change[str]] | None = None
    ) -> None:
        """Write the unit (``unit_writes``), adding what it appended to ``appended``."""
        changes = self._changes(unit) if changes is None else changes
        appended |= write_unit(tx, unit, changes, self._tracing)

    def _step(self, tx: StoreTx, unit: Unit, now: int, appended: Appended) -> int:
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
            event = self._caches.decoded.event(tx, row, unit, now)
            # Consumed either way (the position moves past it); ``handle`` would change
            # nothing for a type the process does not react to (``process.reacts_to``).
            if event is not None and engine.reacts(wanted, event):
                events.append((row, event))
        unit.load([e.partition_key for _, e in events], partial(tx.load_states, process.name))
        tracing = engine.spans_of(self._tracing, process.name)
        for row, event in events:
            key = event.partition_key

            def traceparent(row: InputRow = row, inv: str = event.invocation_id) -> str | None:
                if row[5] is None and tracing is not None and tracing.of(inv) is None:
                    # an input without a context (an approver's decision) after a restart:
                    # the invocation's earlier rows carry it
                    return tx.traceparent_of(inv)
                return row[5]

            load = partial(unit.states.__getitem__, key)
            failure = engine.handle_input(unit, key, event, now, load, tracing, traceparent)
            if failure is not None and tx.claim_dead_letter(row[1], row[0]):
                seq, topic, _, _, payload, _ = row
                engine.add_dropped(unit, engine.dropped(
                    f"dead-letter-{topic}-{seq}", (topic, 0, seq), payload, event, failure,
                    process.name, now,
                ))  # fmt: skip
        self._write(tx, unit, appended)
        tx.set_position(process.name, rows[-1][0])
        return len(rows)

    def _committed(self, units: Sequence[Unit]) -> None:
        """After the commit of ``units``: their states are the committed ones."""
        for unit in units:
            unit.committed()
        if self._on_views is not None:
            for unit in units:
                if unit.views:
                    written, unit.views = unit.views, []
                    self._on_views(written)

    def _follow_up(self, units: Sequence[Unit], now: int) -> None:
        """Give each key that emitted events its ``follow_up``, now that they are durable
        (``engine.follow_ups``): each round's outputs and states, of every process in
        ``units`` in process order, commit in one further transaction."""

        def commit(nexts: Sequence[Unit]) -> None:
            work = [(u, self._changes(u)) for u in nexts]
            if any(u.pending or changes for u, changes in work):
                with self.store.transaction() as tx:
                    for nxt, changes in work:
                        self._write(tx, nxt, set(), changes)
            self._committed(nexts)

        try:
            engine.follow_ups(
                units, lambda done: self._unit(done.process), commit, now, self._tracing
            )
        except BaseException:
            self._ownership.unfinished()  # work the commit started: ``recover`` finds it
            raise

    def fire_timers(self, process: Process[Any], now_ms: int | None = None) -> int:
        """Run ``due`` for up to ``batch_size`` keys whose ``next_due <= now``, in one
        transaction; returns how many of them changed state or emitted outputs."""
        with self._caches.guard():
            self._ready()
            now = self._clock() if now_ms is None else now_ms
            if not self.store.has_due(process.name, now):
                return 0
            return self._alone(process, now, self._fire)

    def _fire(self, tx: StoreTx, unit: Unit, now: int, appended: Appended) -> int:
        """``due`` for up to ``batch_size`` due keys inside ``tx``, written; returns how many
        keys fired or changed. ``unit`` must be new: its inputs come after (``run_once``)."""
        name = unit.process.name
        due = tx.due_states(name, now, self._batch_size)
        if not due:
            return 0
        found = dict(due)
        fired = engine.fire_due(unit, found, lambda keys: found, now, self._batch_size)
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
        with self._caches.guard():
            for process in self.processes:
                if not process.recovers:
                    continue
                after = ""
                while True:
                    unit = self._unit(process)
                    with self.store.transaction() as tx:
                        page = tx.states_after(process.name, after, self._batch_size)
                        engine.recover_keys(unit, page, now)
                        emitted += sum(not isinstance(r, ViewRecord) for r in unit.records)
                        self._write(tx, unit, set())
                    self._committed([unit])
                    self._follow_up([unit], now)
                    if len(page) < self._batch_size:
                        break
                    after = page[-1][0]
        self._ownership.recovered = True
        return emitted

    # --- the round (the loops that repeat it: ``loops``) ------------------------------------

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
            with self._caches.guard():
                self._ready()
                now = self._clock()
                if not self._has_work(now):
                    self._requests.prune()
                    return 0
                progress = 0
                units = [self._unit(process) for process in self.processes]
                with self.store.transaction() as tx:
                    progress += self._steps(tx, units, now)
                    for process in self.processes:
                        self._caches.positions[process.name] = tx.position(process.name)
                self._committed(units)
                self._follow_up(units, now)
                self._caches.prune_decoded()
                self._requests.prune()
        except BaseException:
            self._ownership.failed = True  # the next holder must recover (``try_acquire``)
            raise
        return progress

    def _steps(self, tx: StoreTx, units: Sequence[Unit], now: int) -> int:
        """Each process's due timers and one batch of its inputs, in the round's
        transaction, in the order of ``round_order`` (back to a process that answers what
        a later one asked)."""

        def visit(at: int, first: bool) -> tuple[int, Appended]:
            unit, asked = units[at], Appended()
            fired = self._fire(tx, unit, now, asked) if first else 0
            return fired + self._step(tx, unit, now, asked), asked

        return in_answer_order([self._answers[u.process.name] for u in units], visit)
