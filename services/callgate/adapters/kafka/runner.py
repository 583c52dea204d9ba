"""The Kafka runner: runs one process (``domain.process_port``) exactly once per input record.

One set of processes, two runners (docs/contract.md "Backends"): this one reads Kafka topics and
commits with Kafka transactions; ``callgate.adapters.embedded`` does the same over SQLite.
Why it is hand-written on confluent-kafka + rocksdict rather than Quix Streams: ADR 0007.

The commit sequence (Quix-style; this is exactly what ``poll_once`` does):

1. consume a batch of the process's input topics (``read_committed``, no auto commit;
   ``consumer.InputConsumer.consume``);
2. for each record, in order: decode it (``records.Records.decode``). A record that does not
   decode, whose event type does not belong on its topic, or whose Kafka key is not its
   ``partition_key``, is dead-lettered (``EventDeadLettered``, code ``malformed_event``) and
   the partition keeps moving. Otherwise load the key's state (batch overlay, else rocksdict,
   else ``initial_state``), call ``handle``, and produce its outputs inside the open
   transaction (``records.Records.encode``).
   An exception out of ``handle`` or out of encoding its outputs is classified by
   ``callgate.adapters.failures.classify`` (shared with the embedded runner): a transient
   one aborts the transaction (see below); a deterministic one restores the key's state,
   dead-letters the record with the reason and, for a client request, produces the
   caller's coded outcome (``failures.answers``): the partition keeps moving;
3. fire due timers (``due`` for keys whose ``next_due <= now``, from an in-memory index of
   the owned partitions);
4. produce each changed state to the changelog, to the partition number of its input;
   flush, so the changelog offsets are known (``Checkpoint.produce_changelog``);
5. ``send_offsets_to_transaction``: the input positions and the changelog bounds (one past
   each partition's last changelog record, see ``state``) with the consumer group metadata
   (KIP-447 zombie fencing);
6. ``commit_transaction``;
7. apply the committed states to rocksdict (the store never holds uncommitted state) and
   update the timer index;
8. ``follow_up`` for every key that emitted events (the executor calls providers here), its
   outputs and state committed by steps 4-7 in a further transaction, repeated while a
   round emits events.

On any other error (transient: broker, disk): abort the transaction, re-read the committed
positions and changelog bounds from the broker, restore state to them, re-seek the inputs,
and retry with a new producer (``checkpoint``) -- never skip. A fenced producer raises
``ProducerFenced``: the runner must exit, not continue. A blocking client call that
outlives its bound ends the worker (``watchdog``).

Inputs are read ``read_committed``: records of aborted upstream transactions are never
seen. Processes stay idempotent per ``event_id`` all the same: a guard that costs one set
lookup, kept because the same processes run under at-least-once delivery elsewhere (the
in-memory runner's property tests deliver duplicates: ``callgate.adapters.memory.Chaos``).

On assignment: restore each partition's store from the changelog, rebuild the timer index,
then (processes with ``recovers``) call ``recover`` for every restored key and commit the
results before processing new input.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, Message, TopicPartition

from callgate.adapters import engine
from callgate.adapters.kafka.checkpoint import process_checkpoint, raise_if_fatal
from callgate.adapters.kafka.client import EventCodec, position, traceparent_of
from callgate.adapters.kafka.connection import BrokerAddress
from callgate.adapters.kafka.consumer import JOIN_OVERDUE_S, InputConsumer, is_record
from callgate.adapters.kafka.deferred import DeferredPositions
from callgate.adapters.kafka.partitions import Key, OwnedPartitions
from callgate.adapters.kafka.records import Record, Records
from callgate.adapters.kafka.retries import Retries
from callgate.adapters.kafka.state import ChangelogReader
from callgate.adapters.kafka.topics import Topics
from callgate.adapters.kafka.watchdog import Watchdog
from callgate.adapters.unit_of_work import StateCache, UnitOfWork
from callgate.adapters.view_codec import ViewEncoder
from callgate.domain.events import Event
from callgate.domain.process_port import Process, ViewRecord, reacts_to
from callgate_projections import keeps_states_immutable

if TYPE_CHECKING:
    from callgate.tracing import Tracing

log = logging.getLogger(__name__)

_Unit = UnitOfWork[Key, Record]


class KafkaRunner:
    """Runs one process over its input topics with Kafka transactions (see module docstring).

    ``instance_id`` names this instance: it fixes the ``transactional.id``, so it must be
    stable across restarts (a restarted runner fences its previous self and aborts its open
    transaction at once) and unique among live instances (two runners with one id fence
    each other). ``state_dir`` is this instance's own directory (rocksdict stores under
    ``<state_dir>/<process>/p<partition>``); losing it only costs a longer restore.
    """

    def __init__(
        self,
        process: Process[Any],
        codec: EventCodec,
        topics: Topics,
        bootstrap: BrokerAddress,
        instance_id: str,
        state_dir: Path | str,
        clock: Callable[[], int],
        batch_size: int = 500,
        batch_timeout_ms: int = 100,
        consumer_overrides: Mapping[str, Any] | None = None,
        batch_linger_ms: float = 0.0,
        max_retries: int = 8,
        on_views: Callable[[Sequence[ViewRecord]], None] | None = None,
        views: ViewEncoder | None = None,
        transaction_gap_ms: float = 0.0,
        join_overdue_s: float = JOIN_OVERDUE_S,
        tracing: Tracing | None = None,
        before_batch: Callable[[], None] | None = None,
        watchdog: Watchdog | None = None,
        stalled_since: float | None = None,
    ) -> None:
        """``watchdog`` bounds every blocking client call (``watchdog``: a call past its
        bound ends the worker; None: the client's own timeouts only). ``stalled_since``
        (``time.time()``): this runner replaces one that stopped making progress then; its
        first commit says that work resumed.
        ``before_batch`` is called in the loop's thread before each batch is handled
        (the decider folds the control events of its global input there, ADR 0064).
        ``on_views`` is called after each committed transaction with its view records
        (``callgate serve`` prints a line per settled decision from the status view).
        ``transaction_gap_ms``: begin a transaction no sooner than this after the last
        commit; ``callgate serve``'s workers pass ``TRANSACTION_GAP_MS`` (Apache Kafka),
        0 begins at once. ``join_overdue_s``: ``JOIN_OVERDUE_S``.
        ``batch_linger_ms``: after a cycle's first record, wait this long for more (0: take
        only what is already fetched); the worker gives it to the processes no caller waits
        on (``worker.BATCH_LINGER_MS``)."""
        self.process = process
        self._tracing = tracing  # spans around handle and follow_up (ADR 0036); None: off
        self._on_views = on_views
        self._before_batch = before_batch
        self._clock = clock
        self._batch_size = batch_size
        self._inputs = {topics.physical(t): t for t in sorted(process.inputs)}
        self._changelog = topics.changelog(process.name)
        self._group = InputConsumer(
            bootstrap, topics.group(process.name), f"{process.name}.{instance_id}",
            list(self._inputs), consumer_overrides, self._close_stores,
            (batch_size, batch_timeout_ms / 1000, batch_linger_ms / 1000), join_overdue_s,
        )  # fmt: skip
        self._consumer = self._group.consumer
        self._checkpoint = process_checkpoint(
            bootstrap, topics, process.name, instance_id, self._consumer,
            next(iter(self._inputs)), transaction_gap_ms / 1000, watchdog,
        )  # fmt: skip
        self._reader = ChangelogReader(bootstrap)
        self._partitions = OwnedPartitions(
            Path(state_dir) / process.name, self._changelog, list(self._inputs), self._reader,
            self._consumer, lambda blob: process.next_due(process.load_state(blob)),
            self._checkpoint.bounded,
        )  # fmt: skip
        self._needs_recover = False
        self._rewind_pending = False
        self._retries = Retries(max_retries, stalled_since)
        self._initial_blob = process.dump_state(process.initial_state())
        self._reacts_to = reacts_to(process)
        self._records = Records(process.name, codec, views, topics, self._reacts_to, tracing)
        self._immutable = keeps_states_immutable(process)
        # Committed state objects kept between transactions (saves a ``load_state`` per
        # event of a recently touched key): an aborted one leaves nothing here (``StateCache``).
        self._cache: StateCache[Key] = StateCache()
        self._deferred = DeferredPositions()  # of no-op cycles, not committed yet
        self._started = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Fence older incarnations (aborting their open transaction) and join the group."""
        if self._started:
            return
        self._checkpoint.init()
        self._group.subscribe()
        self._started = True

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set (or the producer is fenced: ``ProducerFenced``)."""
        self.start()
        try:
            while not stop.is_set():
                self.poll_once()
        finally:
            self.close()

    def close(self) -> None:
        """Release everything, even after a fatal error (which ``run`` re-raises)."""
        self._close_stores()
        closings = (
            self._consumer.close,
            self._checkpoint.no_member.close,
            self._reader.close,
            lambda: self._checkpoint.producer.flush(10),
        )
        for closing in closings:
            try:
                closing()
            except KafkaException as exc:  # the client already failed; the cause is raised
                log.warning("%s: while closing: %s", self.process.name, exc)

    @property
    def owned_partitions(self) -> list[int]:
        return self._partitions.owned()

    @property
    def transactions(self) -> int:
        """Committed by this runner: the broker's work scales with it."""
        return self._checkpoint.transactions

    # --- the loop ------------------------------------------------------------------------------

    def poll_once(self) -> int:
        """One pass of the commit sequence; returns the records consumed."""
        self.start()
        msgs: list[Message] = []
        try:
            self._checkpoint.ready()
            if self._rewind_pending:
                self._rewind()
            msgs = self._group.consume(self._partitions.next_due(), self._clock)
            if self._before_batch is not None:
                self._before_batch()
            self._group.warn_if_join_overdue(self.process.name)
            if (assigned := self._group.take_assignment()) is not None:
                self._take_ownership(assigned)
            if self._needs_recover:
                self._recover_all()
            now = self._clock()
            unit, positions = self._unit(), dict[tuple[str, int], int]()
            for msg in msgs:
                self._handle_record(unit, positions, msg, now)
            self._fire_due(unit, now)
            self._commit(unit, positions)
            self._follow_up(unit, now)
            self._retries.succeeded()
        except Exception as exc:
            self._after_failure(exc)
        return len(msgs)

    def _handle_record(
        self, unit: _Unit, positions: dict[tuple[str, int], int], msg: Message, now: int
    ) -> None:
        if not is_record(msg, self.process.name):
            return
        topic, partition, offset = position(msg)
        if self._partitions.handled(topic, partition, offset):
            return  # not ours (any more), or already committed: fetched before a rebalance
        positions[(topic, partition)] = offset + 1
        logical = self._inputs[topic]
        value = msg.value() or b""
        if self._records.passed_over(value, logical):
            return  # consumed and committed undecoded: ``handle`` would change nothing
        # Deterministic id: a re-run after an abort or crash cannot mint a second one. Every
        # process reading the topic dead-letters the record: readers dedupe by event_id.
        source = (logical, partition, offset)
        dead_id = f"dead-letter-{logical}-{partition}-{offset}"
        event = self._records.decode(msg, source, dead_id, now)
        if not isinstance(event, Event):  # its dead letter
            unit.records.append(event)
            self._send(unit)
            return
        if not engine.reacts(self._reacts_to, event):
            return  # consumed and committed; ``handle`` would change nothing (reacts_to)
        key = (partition, event.partition_key)
        tracing = engine.spans_of(self._tracing, self.process.name)
        # A transient failure propagates: abort, rewind, retry (``_after_failure``).
        load = partial(unit.get, key, self._partitions.read)
        traceparent = partial(traceparent_of, msg)
        failure = engine.handle_input(unit, key, event, now, load, tracing, traceparent)
        if failure is not None:
            dropped = engine.dropped(dead_id, source, value, event, failure, self.process.name, now)
            engine.add_dropped(unit, dropped)
        self._send(unit)

    # --- state and outputs -----------------------------------------------------------------

    def _unit(self) -> _Unit:
        return UnitOfWork(
            self.process, self._records.encode, self._cache, self._immutable,
            self._on_views is not None,
        )  # fmt: skip

    def _send(self, unit: _Unit) -> None:
        """Produce what the unit holds into the open transaction (begun by the first): the
        producer sends it within a millisecond, while the next records are handled."""
        for topic, key, value, extra in unit.records:
            self._checkpoint.produce(topic, key, value, headers=extra)
        unit.records = []

    def _commit(self, unit: _Unit, positions: Mapping[tuple[str, int], int]) -> None:
        """Steps 4-7 of the commit sequence; a cycle that emitted nothing and changed no
        state commits its positions later (``deferred``)."""
        self._send(unit)
        changes = unit.changes(self._initial_blob)
        checkpoint = self._checkpoint
        if not (checkpoint.token is not None or changes):
            due = self._deferred.hold(positions)
            unit.committed()  # unchanged: still the committed states
            if not due:
                return
        positions = self._deferred.with_(positions)
        blobs: dict[int, dict[str, bytes]] = {}
        for (partition, key), blob, _ in changes:
            blobs.setdefault(partition, {})[key] = blob
        stores = self._partitions.stores
        heads = {partition: stores[partition].head for partition in blobs}
        bounds = checkpoint.produce_changelog(self._changelog, blobs, heads)
        offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        offsets += [TopicPartition(self._changelog, p, o) for p, o in bounds.items()]
        token = checkpoint.commit(offsets)
        if (stalled := self._retries.resumed()) is not None:
            log.warning(
                "%s: resumed: a transaction committed %.1f s after it stopped making progress",
                self.process.name, stalled,
            )  # fmt: skip
        if unit.views and self._on_views is not None:
            written, unit.views = unit.views, []
            self._on_views(written)
        self._partitions.committed.update(positions)
        self._deferred.clear()
        for partition, changed in blobs.items():
            stores[partition].apply(changed, bounds[partition], token)
        for owned_key, state in unit.states.items():
            self._partitions.set_due(owned_key, self.process.next_due(state))
        unit.written(changes)
        unit.committed()

    def _follow_up(self, unit: _Unit, now: int) -> None:
        """Step 8: ``follow_up`` for keys whose events are now durable, until none emit."""
        engine.follow_ups(
            [unit], lambda done: self._unit(), lambda nexts: self._commit(nexts[0], {}), now,
            self._tracing, owned=lambda key: key[0] in self._partitions,
        )  # fmt: skip

    # --- timers ------------------------------------------------------------------------------

    def _fire_due(self, unit: _Unit, now: int) -> None:
        partitions = self._partitions
        engine.fire_due(unit, partitions.due_keys(now), partitions.read, now, self._batch_size)
        self._send(unit)

    # --- ownership, restore, recovery --------------------------------------------------------

    def _close_stores(self) -> None:
        self._partitions.close()
        self._cache.clear()
        self._deferred.clear()

    def _take_ownership(self, partitions: list[int]) -> None:
        self._close_stores()
        self._partitions.take(partitions)
        self._restore()
        self._needs_recover = self.process.recovers

    def _restore(self) -> None:
        """Bring the owned partitions up to what the broker committed (``partitions``)."""
        self._cache.clear()
        self._partitions.restore()

    def _recover_all(self) -> None:
        """``recover`` every stored key, in transactions of ``batch_size`` keys (read
        lazily: ``OwnedPartitions.stored``)."""
        now = self._clock()
        for chunk in self._partitions.stored(self._batch_size):
            unit = self._unit()
            engine.recover_keys(unit, chunk, now)
            self._commit(unit, {})
            self._follow_up(unit, now)
        self._needs_recover = False

    def _after_failure(self, exc: Exception) -> None:
        """Abort; the next ``poll_once`` rewinds to what the broker committed and retries,
        with a new producer of the same ``transactional.id`` (``Checkpoint.abort``).

        Raises ``ProducerFenced`` when fenced, the error itself when it is fatal or when
        ``max_retries`` consecutive attempts failed (a supervisor restarts the runner).
        """
        raise_if_fatal(exc)
        retry = self._retries.failed()
        self._deferred.clear()  # rewound to the committed positions: re-read, no-ops again
        log.warning("%s: transaction failed (%r), rewinding", self.process.name, exc)
        self._checkpoint.abort()
        if not retry:
            raise exc
        self._retries.back_off()
        self._rewind_pending = True

    def _rewind(self) -> None:
        """Restore state to the committed changelog and seek inputs to committed positions."""
        if self._partitions.stores:
            self._restore()
            self._partitions.seek()
            self._needs_recover = self.process.recovers
        self._rewind_pending = False
