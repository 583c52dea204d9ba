"""The embedded runner: executes ``callgate.domain.process.Process`` implementations over the store.

One set of processes, two runners (docs/contract.md "Backends"): this one reads the SQLite log
instead
of Kafka topics and commits to the same database. Exactly-once per process comes from
storage, as in the ``eventsourcing`` library: the input position is written in the same
transaction as everything the inputs caused, so a crash (even ``kill -9``) either loses the
whole batch (and it is read again) or none of it.

Only one runner may execute processes over one state directory at a time, because the
executor calls providers and two runners would both reconcile one execution. The guard is an
OS file lock on ``<state_dir>/runner.lock`` that the kernel drops when its holder dies.

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

import fcntl
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from callgate.adapters.avro_codec import MalformedEvent
from callgate.adapters.embedded.lock import LOCK_FILE
from callgate.adapters.embedded.store import (
    EmbeddedStore,
    EventCodec,
    InputRow,
    NewRow,
    StoreTx,
    event_row,
)
from callgate.adapters.engine import (
    STATE_CACHE_KEYS,
    StateCache,
    decode_input,
    follow_up_round,
    react,
    reacts,
    restore,
)
from callgate.adapters.failures import Deterministic, answers, dead_letter
from callgate.domain.codes import Code, storage_failure
from callgate.domain.events import Event
from callgate.domain.process import Output, Process, ViewRecord, answered_by, reacts_to
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
# Bound on the decoded-row cache if some process lags far behind the others.
_DECODED_ROWS = 20_000
# A round the disk refused is tried again after 0.05 s, 0.1 s, 0.2 s, ... at most
# RETRY_MAX_S apart (ADR 0084): the first try after space returns comes within a second.
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0


def retry_delay(attempt: int) -> float:
    """The pause after the ``attempt``-th refused round in a row (1, 2, ...)."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2.0 ** min(attempt - 1, 32))


class StorageObserver(Protocol):
    """Hears when the disk refuses ``serve``'s rounds, and when it takes them again."""

    def refused(self, reason: str, attempt: int, retry_in_s: float) -> None: ...

    def resumed(self, attempts: int, seconds: float) -> None: ...


# (key, blob, next_due): a state row to write.
_Change = tuple[str, bytes, int | None]


class RunnerLockNotHeld(RuntimeError):
    """A runner tried to execute processes without holding the state directory's lock."""


class _Poison:
    """A row that does not decode (or is on the wrong topic), with the reason, cached."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Batch:
    """What one transaction of one process produces: key states, log rows, view records.

    States are held per key for the batch; on ``write`` only keys whose dumped state
    differs from what is stored (or from the initial state, for new keys) are written, so
    stateless projections cost no state writes.
    """

    __slots__ = (
        "appended",
        "committed",
        "immutable",
        "observed",
        "origin",
        "process",
        "rows",
        "states",
        "stored",
        "tracing",
        "views",
        "written_views",
    )

    def __init__(
        self,
        process: Process[Any],
        immutable: bool,
        observed: bool = False,
        tracing: Tracing | None = None,
    ) -> None:
        self.process = process
        self.tracing = tracing
        self.immutable = immutable
        self.observed = observed  # keep written view records for the runner's observer
        self.written_views: list[ViewRecord] = []
        self.states: dict[str, Any] = {}
        self.origin: dict[str, Any] = {}  # the object each key started the batch with
        self.stored: dict[str, bytes | None] = {}
        self.rows: list[NewRow] = []
        self.views: list[ViewRecord] = []
        self.committed: dict[str, list[Event]] = {}
        self.appended: set[tuple[str, str | None]] = set()  # (topic, event type) written

    def load(self, tx: StoreTx, keys: Sequence[str], cache: StateCache[str]) -> None:
        """The states of ``keys``: from the cache of committed states, else from the store."""
        missing: list[str] = []
        for key in dict.fromkeys(keys):
            if key in self.stored:
                continue
            cached = cache.take(key)
            if cached is None:
                missing.append(key)
            else:
                self.seed(key, *cached)
        if not missing:
            return
        process = self.process
        found = tx.load_states(process.name, missing)
        for key in missing:
            blob = found.get(key)
            state = process.load_state(blob) if blob is not None else process.initial_state()
            self.seed(key, state, blob)

    def reset(self, key: str, handled: Sequence[Event], now: int) -> None:
        """Undo a failed ``handle`` (it may have changed the state in place before raising):
        back to the stored state, then re-apply ``handled``, the events of the key this batch
        handled before. ``handle`` is deterministic, so their outputs (already kept) are not
        emitted again."""
        self.states[key] = restore(self.process, self.stored[key], handled, now)

    def seed(self, key: str, state: Any, blob: bytes | None) -> None:
        self.states[key] = state
        self.origin[key] = state
        self.stored[key] = blob

    def apply(self, key: str, state: Any, outputs: Sequence[Output], codec: EventCodec) -> None:
        """Keep ``outputs`` and the new state. Every event is encoded before anything is
        kept, so an output that cannot be encoded leaves the batch as it was (and the
        caller's failure handling sees the error)."""
        rows = [
            event_row(out, codec.encode(out)) for out in outputs if not isinstance(out, ViewRecord)
        ]
        self.states[key] = state
        self.rows += rows
        for out in outputs:
            if isinstance(out, ViewRecord):
                self.views.append(out)
            else:
                self.committed.setdefault(key, []).append(out)

    def changes(self, initial_blob: bytes) -> list[_Change]:
        """``(key, blob, next_due)`` of states that differ from the stored (or initial) one.

        An immutable-state process's key still holding the object it started with is
        unchanged by construction: not dumped."""
        process, origin, immutable = self.process, self.origin, self.immutable
        changed: list[_Change] = []
        for key, state in self.states.items():
            if immutable and state is origin[key]:
                continue
            blob = process.dump_state(state)
            stored = self.stored[key]
            if blob != (initial_blob if stored is None else stored):
                changed.append((key, blob, process.next_due(state)))
        return changed

    def write(self, tx: StoreTx, changes: Sequence[_Change]) -> None:
        """Append the outputs, apply the view records in order, write ``changes``.

        Afterwards the stored bytes match every key's state again, so one batch may go on
        (timers, then the inputs of the same round) and be written once more."""
        if self.rows:
            tracing = self.tracing
            traces = None
            if tracing is not None:  # each traced invocation's rows carry its context on
                known = ((row[3], tracing.of(row[3])) for row in self.rows if row[3])
                traces = {inv: tp for inv, tp in known if inv is not None and tp is not None}
            tx.insert(self.rows, traces)
            self.appended.update((row[0], row[2]) for row in self.rows)
            self.rows = []
        if self.views:
            tx.put_views((v.view, v.key, v.value_json) for v in self.views)
            if self.observed:
                self.written_views.extend(self.views)
            self.views = []
        if changes:
            tx.put_states(self.process.name, changes)
        for key, blob, _ in changes:
            self.stored[key] = blob
        self.origin.update(self.states)

    @property
    def emitted(self) -> bool:
        """Whether outputs wait to be written."""
        return bool(self.rows or self.views)


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
        self._lock_fd: int | None = None
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
        self._decoded: dict[int, Event | _Poison] = {}
        self._decoded_order: deque[int] = deque()  # the keys of ``_decoded``, as inserted
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
        self._decoded_order.clear()
        self._positions.clear()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self._forget()
            raise

    def _keep(self, batch: _Batch) -> None:
        """Remember a committed batch's states (call only after its commit)."""
        stored = batch.stored
        self._states[batch.process.name].keep((k, s, stored[k]) for k, s in batch.states.items())

    def _prune_decoded(self) -> None:
        """Drop decoded rows every process has consumed (or all, past the bound)."""
        if len(self._decoded) > _DECODED_ROWS:
            self._decoded.clear()
            self._decoded_order.clear()
            return
        if len(self._positions) < len(self.processes):
            return
        low = min(self._positions.values())
        decoded, order = self._decoded, self._decoded_order
        # Rows are decoded in nearly ascending ``seq``: drop from the oldest while consumed
        # (a straggler stays until the rows before it are gone, or the bound clears all).
        while order and order[0] <= low:
            del decoded[order.popleft()]

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
        self._forget()  # another runner may have held the lock since we last did
        try:
            with self.store.transaction() as tx:
                self._needs_recovery = tx.meta("dirty") != "0"
                tx.set_meta("dirty", "1")
        except BaseException:
            os.close(fd)  # a disk that refuses the write (ADR 0084): the lock is not held
            raise
        self._lock_fd = fd
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
            try:
                if not self._failed:
                    with self.store.transaction() as tx:
                        tx.set_meta("dirty", "0")
            finally:  # a refused write leaves the store marked dirty: the next holder recovers
                os.close(self._lock_fd)  # closing the descriptor drops the flock
                self._lock_fd = None
                self._recovered = False
                self._forget()

    def _ready(self) -> None:
        if self._lock_fd is None:
            raise RunnerLockNotHeld(f"{self.store.state_dir / LOCK_FILE} is not held")
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
            batch = self._batch(process)
            with self.store.transaction() as tx:
                consumed = self._step(tx, batch, now)
            self._committed([batch])
            self._follow_up([batch], now)
        return consumed

    def _batch(self, process: Process[Any]) -> _Batch:
        return _Batch(
            process, self._immutable[process.name], self._on_views is not None, self._tracing
        )

    def _step(self, tx: StoreTx, batch: _Batch, now: int) -> int:
        """The next batch of ``batch.process``'s inputs, inside ``tx``; returns how many log
        rows it consumed. The commit sequence (THE exactly-once mechanism), all in the
        caller's ``BEGIN IMMEDIATE`` transaction:

        1. read the process's position and the next ``batch_size`` rows of its input topics
           after it;
        2. decode each row (once per runner, see the module docstring); a row that does not
           decode, or whose event type does not belong on its topic, is dead-lettered
           (``malformed_event``, with reason and original bytes, once per row however many
           processes read it) and skipped: poison input never stops the stream;
        3. load the states of the batch's keys, fold ``handle`` over the events in log order.
           An exception out of ``handle`` (or out of encoding its outputs) is classified by
           ``callgate.adapters.failures.classify``: a transient one rolls the round back (it
           is retried); a deterministic one undoes that event's effect on the key's state,
           dead-letters the row with the reason and, for a client request, appends the
           caller's coded outcome (``failures.answers``);
        4. append output events to the log (topic = the event class's ``TOPIC``), upsert or
           delete view records, write changed states with their ``next_due``;
        5. set the position to the last consumed ``seq``; the caller COMMITs.

        Outputs, state and position become durable together or not at all. Afterwards,
        outside that transaction, ``follow_up`` runs for every key that emitted events.
        """
        process = batch.process
        position = tx.position(process.name)
        rows = tx.fetch_inputs(process.inputs, position, self._batch_size)
        if not rows:
            return 0
        events: list[tuple[InputRow, Event]] = []
        wanted = self._reacts_to[process.name]
        for row in rows:
            event = self._decode(tx, row, process, now, batch)
            # Consumed either way (the position moves past it); ``handle`` would change
            # nothing for a type the process does not react to (``process.reacts_to``).
            if event is not None and reacts(wanted, event):
                events.append((row, event))
        batch.load(tx, [ev.partition_key for _, ev in events], self._states[process.name])
        states, codec, tracing = batch.states, self._codec, self._tracing
        if tracing is not None and not tracing.follows(process.name):
            tracing = None
        failed: set[int] = set()
        for i, (row, event) in enumerate(events):
            key = event.partition_key

            def keep(state: Any, outputs: Sequence[Output], key: str = key) -> None:
                if outputs:
                    batch.apply(key, state, outputs, codec)
                else:
                    states[key] = state

            # A transient failure propagates: the transaction rolls back, the round is retried.
            if tracing is None:
                failure = react(process, partial(states.__getitem__, key), event, now, keep)
            else:
                traceparent = row[5]
                if traceparent is None and tracing.of(event.invocation_id) is None:
                    # an input without a context (an approver's decision) after a restart:
                    # the invocation's earlier rows carry it
                    traceparent = tx.traceparent_of(event.invocation_id)
                with tracing.handling(process.name, event, traceparent) as note:

                    def keep_noted(
                        state: Any, outputs: Sequence[Output], keep: Any = keep, note: Any = note
                    ) -> None:
                        keep(state, outputs)
                        note(outputs)

                    failure = react(
                        process, partial(states.__getitem__, key), event, now, keep_noted
                    )
            if failure is not None:
                failed.add(i)
                earlier = [
                    ev
                    for j, (_, ev) in enumerate(events[:i])
                    if ev.partition_key == key and j not in failed
                ]
                batch.reset(key, earlier, now)
                if tx.claim_dead_letter(row[1], row[0]):
                    self._drop(row, event, failure, process, now, batch)
        batch.write(tx, batch.changes(self._initial_blobs[process.name]))
        tx.set_position(process.name, rows[-1][0])
        return len(rows)

    def _decode(
        self, tx: StoreTx, row: InputRow, process: Process[Any], now: int, batch: _Batch
    ) -> Event | None:
        seq, topic = row[0], row[1]
        decoded = self._decoded.get(seq)
        if decoded is None:
            try:
                decoded = decode_input(self._codec.decode, row[4], topic)
            except MalformedEvent as exc:
                decoded = _Poison(exc.reason)
            self._decoded[seq] = decoded
            self._decoded_order.append(seq)
        if isinstance(decoded, _Poison):
            if tx.claim_dead_letter(topic, seq):
                self._dead_letter(row, decoded.reason, process, now, batch)
            return None
        return decoded

    def _dead_letter(
        self, row: InputRow, reason: str, process: Process[Any], now: int, batch: _Batch
    ) -> None:
        """A row that does not decode (or is on the wrong topic): ``malformed_event``."""
        self._append_dead_letter(
            row, Deterministic(Code.MALFORMED_EVENT, reason), process, now, batch, raw_reason=reason
        )

    def _drop(
        self,
        row: InputRow,
        event: Event,
        failure: Deterministic,
        process: Process[Any],
        now: int,
        batch: _Batch,
    ) -> None:
        """An input ``handle`` cannot process (``callgate.adapters.failures``): dead-letter it
        and give a client request its coded outcome, in the same transaction."""
        self._append_dead_letter(row, failure, process, now, batch)
        for answer in answers(event, failure, process.name, now):
            try:
                batch.rows.append(event_row(answer, self._codec.encode(answer)))
            except MalformedEvent:
                continue  # ids that cannot be encoded: the dead-letter above records the input

    def _append_dead_letter(
        self,
        row: InputRow,
        failure: Deterministic,
        process: Process[Any],
        now: int,
        batch: _Batch,
        raw_reason: str | None = None,
    ) -> None:
        seq, topic, partition_key, invocation_id, payload, _ = row
        # Deterministic id: a rebuilt log (replay) names the same dead-letter the same way.
        dead = dead_letter(
            f"dead-letter-{topic}-{seq}",
            invocation_id or "",
            partition_key,
            process.name,
            now,
            failure,
            (topic, 0, seq),
            payload,
        )
        if raw_reason is not None:
            dead = replace(dead, reason=raw_reason)
        batch.rows.append(event_row(dead, self._codec.encode(dead)))

    def _committed(self, batches: Sequence[_Batch]) -> None:
        """After the commit of ``batches``: their states are the committed ones."""
        for batch in batches:
            self._keep(batch)
        if self._on_views is not None:
            for batch in batches:
                if batch.written_views:
                    written, batch.written_views = batch.written_views, []
                    self._on_views(written)

    def _follow_up(self, batches: Sequence[_Batch], now: int) -> None:
        """Give each key that emitted events its ``follow_up``, now that they are durable.

        Each round's outputs and states (of every process in ``batches``, in process order)
        are committed in one further transaction; if that round emitted events,
        ``follow_up`` runs again for them, until a round emits none. A crash between the
        commits loses no input: the executor's ``recover`` finds the started-but-unfinished
        work on restart (C12).
        """
        try:
            self._follow_up_rounds([b for b in batches if b.committed], now)
        except BaseException:
            # Work started by the commit may be unfinished (a provider called, its outcome
            # not written): before new input, ``recover`` finds it, as after a restart.
            self._recovered = False
            self._needs_recovery = True
            raise

    def _follow_up_rounds(self, pending: list[_Batch], now: int) -> None:
        while pending:
            nexts: list[tuple[_Batch, list[_Change]]] = []
            for batch in pending:
                process = batch.process
                nxt = _Batch(process, batch.immutable, batch.observed, self._tracing)

                def state_of(key: str, batch: _Batch = batch, nxt: _Batch = nxt) -> Any:
                    nxt.seed(key, batch.states[key], batch.stored[key])
                    return batch.states[key]

                def keep(
                    key: str, state: Any, outputs: Sequence[Output], nxt: _Batch = nxt
                ) -> None:
                    nxt.apply(key, state, outputs, self._codec)

                follow_up_round(process, batch.committed, state_of, keep, now, self._tracing)
                nexts.append((nxt, nxt.changes(self._initial_blobs[process.name])))
            work = [(nxt, changes) for nxt, changes in nexts if changes or nxt.emitted]
            if work:
                with self.store.transaction() as tx:
                    for nxt, changes in work:
                        nxt.write(tx, changes)
            self._committed([nxt for nxt, _ in nexts])
            pending = [nxt for nxt, _ in nexts if nxt.committed]

    def fire_timers(self, process: Process[Any], now_ms: int | None = None) -> int:
        """Run ``due`` for up to ``batch_size`` keys whose ``next_due <= now``, in one
        transaction; returns how many of them changed state or emitted outputs."""
        with self._guard():
            self._ready()
            now = self._clock() if now_ms is None else now_ms
            if not self.store.has_due(process.name, now):
                return 0
            batch = self._batch(process)
            with self.store.transaction() as tx:
                fired = self._fire(tx, batch, now)
            self._committed([batch])
            self._follow_up([batch], now)
        return fired

    def _fire(self, tx: StoreTx, batch: _Batch, now: int) -> int:
        """``due`` for up to ``batch_size`` due keys inside ``tx``, written; returns how many
        keys fired or changed. ``batch`` must be new: its inputs come after (``run_once``)."""
        process = batch.process
        fired: set[str] = set()
        cache = self._states[process.name]
        for key, blob in tx.due_states(process.name, now, self._batch_size):
            cached = cache.take(key)
            old = cached[0] if cached is not None and cached[1] == blob else None
            if old is None:
                old = process.load_state(blob)
            batch.seed(key, old, blob)
            state, outputs = process.due(old, now)
            batch.apply(key, state, outputs, self._codec)
            if outputs:
                fired.add(key)
        changes = batch.changes(self._initial_blobs[process.name])
        batch.write(tx, changes)
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
        with self._guard():
            for process in self.processes:
                if not process.recovers:
                    continue
                after = ""
                while True:
                    batch = self._batch(process)
                    with self.store.transaction() as tx:
                        page = tx.states_after(process.name, after, self._batch_size)
                        for key, blob in page:
                            old = process.load_state(blob)
                            batch.seed(key, old, blob)
                            state, outputs = process.recover(old, now)
                            batch.apply(key, state, outputs, self._codec)
                        emitted += len(batch.rows)
                        batch.write(tx, batch.changes(self._initial_blobs[process.name]))
                    self._committed([batch])
                    self._follow_up([batch], now)
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
                batches = [self._batch(process) for process in self.processes]
                with self.store.transaction() as tx:
                    progress += self._steps(tx, batches, now)
                    for process in self.processes:
                        self._positions[process.name] = tx.position(process.name)
                self._committed(batches)
                self._follow_up(batches, now)
                self._prune_decoded()
                self._prune_requests()
        except BaseException:
            self._failed = True  # the next holder must recover (see ``try_acquire``)
            raise
        return progress

    def _steps(self, tx: StoreTx, batches: Sequence[_Batch], now: int) -> int:
        """Each process's due timers and one batch of its inputs, in order, in the round's
        transaction. When a process appends what one before it answers (the invocations
        asking a limit's usage, ADR 0079: ``callgate.domain.process.answered_by``), the round
        goes back to that one at once and on in order from there, so the asking process
        takes the answer before the processes after it (the projections) run. At most
        ``PASSES_BACK`` times; what is left waits for the next round. The outputs are those
        of the rounds this saves (the same inputs in the same order per process), without
        their commits."""
        progress, back, at, reached = 0, 0, 0, -1
        while at < len(batches):
            batch = batches[at]
            if at > reached:  # the first time this round: its timers first, then its inputs
                progress += self._fire(tx, batch, now)
                reached = at
            progress += self._step(tx, batch, now)
            asked = batch.appended
            earlier = next(
                (i for i, b in enumerate(batches[:at]) if self._answers[b.process.name] & asked),
                None,
            )
            asked.clear()
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
        """Run rounds until ``stop`` is set, sleeping briefly when there is nothing to do.

        A round the disk refuses (``storage_failure``: full, past a file-size limit, an I/O
        error) rolled back whole; it is tried again after a pause that grows to
        ``RETRY_MAX_S``, each time after one small write that must succeed first, so a
        full disk neither ends serve nor keeps a core busy, and work resumes by itself
        once the disk takes writes again (ADR 0084). ``storage`` hears of both."""
        refused, since = 0, 0.0
        while not stop.is_set():
            try:
                if refused:
                    self.store.probe_write()
                progress = self.run_once()
            except Exception as exc:
                reason = storage_failure(exc)
                if reason is None:
                    raise
                refused += 1
                since = since or time.monotonic()
                delay = retry_delay(refused)
                if storage is not None:
                    storage.refused(reason, refused, delay)
                stop.wait(delay)
                continue
            if refused and storage is not None:
                storage.resumed(refused, time.monotonic() - since)
            refused, since = 0, 0.0
            if not progress:
                stop.wait(idle_sleep_s)
