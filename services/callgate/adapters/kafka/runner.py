"""The Kafka runner: runs one process (``domain.process_port``) exactly once per input record.

One set of processes, two runners (docs/contract.md "Backends"): this one reads Kafka topics and
commits with Kafka transactions; ``callgate.adapters.embedded`` does the same over SQLite.
Why it is hand-written on confluent-kafka + rocksdict rather than Quix Streams: ADR 0007.

The commit sequence (Quix-style; this is exactly what ``poll_once`` does):

1. consume a batch of the process's input topics (``read_committed``, no auto commit): wait
   up to ``batch_timeout_ms`` for the first record, then take what is already fetched, up
   to ``batch_size`` (under load records queue up while a commit runs); with
   ``batch_linger_ms``, keep collecting that long after the first record (a process no
   caller waits on, such as the audit projection: fewer, larger transactions);
2. for each record, in order: decode it. A record that does not decode, whose event type does
   not belong on its topic, or whose Kafka key is not its ``partition_key``, is dead-lettered
   (``EventDeadLettered``, code ``malformed_event``, reason, source topic/partition/offset,
   original bytes) and the partition keeps moving. Otherwise load the key's state (batch
   overlay, else rocksdict, else ``initial_state``), call ``handle``, and produce its outputs
   inside the open transaction: events to their topic keyed by ``partition_key``,
   ``ViewRecord`` to ``<prefix>.view.<view>`` keyed by view key, its value Avro with the
   view's published schema (``ViewCodec``; None value: tombstone) and its tenant, when
   known, in the ``cg-tenant`` header (ADR 0016).
   An exception out of ``handle`` or out of encoding its outputs is classified by
   ``callgate.adapters.failures.classify`` (shared with the embedded runner): a transient
   one aborts the transaction (see below); a deterministic one restores the key's state,
   dead-letters the record with the reason and, for a client request, produces the
   caller's coded outcome (``failures.answers``): the partition keeps moving;
3. fire due timers (``due`` for keys whose ``next_due <= now``, from an in-memory index of
   the owned partitions);
4. produce each changed state to the changelog, to the partition number of its input;
   flush, so the changelog offsets are known;
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
and retry -- never skip. The retry runs with a new producer of the same ``transactional.id``
(``_replace_producer``): its ``init_transactions`` fences the old one, whose open transaction
the coordinator aborts. A fenced producer (a newer instance with the same
``transactional.id``) raises ``ProducerFenced``: the runner must exit, not continue. A
blocking client call that outlives its bound ends the worker (``watchdog``).

Inputs are read ``read_committed``: records of aborted upstream transactions are never
seen. Processes stay idempotent per ``event_id`` all the same: a guard that costs one set
lookup, kept because the same processes run under at-least-once delivery elsewhere (the
in-memory runner's property tests deliver duplicates: ``callgate.adapters.memory.Chaos``).

On assignment: restore each partition's store from the changelog, rebuild the timer index,
then (processes with ``recovers``) call ``recover`` for every restored key and commit the
results before processing new input.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from callgate.adapters import engine
from callgate.adapters.avro_codec import MalformedEvent
from callgate.adapters.kafka.checkpoint import (
    PRODUCER_LATENCY,
    TRANSACTION_TIMEOUT_MS,
    Checkpoint,
    raise_if_fatal,
)
from callgate.adapters.kafka.client import (
    EventCodec,
    make_consumer,
    make_producer,
    position,
    traceparent_of,
)
from callgate.adapters.kafka.connection import BrokerAddress
from callgate.adapters.kafka.partitions import Key, OwnedPartitions
from callgate.adapters.kafka.state import (
    HEADER_PREV,
    ChangelogReader,
)
from callgate.adapters.kafka.topics import (
    HEADER_TENANT,
    Topics,
)
from callgate.adapters.kafka.watchdog import Watchdog
from callgate.adapters.unit_of_work import StateCache, UnitOfWork
from callgate.adapters.view_codec import ViewCodec, ViewEncoder
from callgate.domain.process_port import Output, Process, ViewRecord, reacts_to
from callgate.tracing import TRACEPARENT
from callgate_projections import keeps_states_immutable

if TYPE_CHECKING:
    from callgate.tracing import Tracing

log = logging.getLogger(__name__)

# A cycle that emitted nothing and changed no state commits its input positions with the
# next transaction, or at the first cycle this long after it (``_commit``).
NOOP_COMMIT_DELAY_S = 0.5
# Failover bounds (ADR 0015): a SIGKILLed instance is out of its groups after
# ``session.timeout.ms``; its open transaction, which holds back ``read_committed`` readers
# and the committed offsets of its partitions, is aborted by the broker after
# ``transaction.timeout.ms`` (plus the broker's abort check interval). A transaction lasts
# one batch and its follow-ups: far less than this, unless a provider hangs.
GROUP_SETTINGS: dict[str, Any] = {"session.timeout.ms": 10_000, "heartbeat.interval.ms": 1_000}
# A runner with no partitions this long after joining its group (or after a revocation) logs a
# warning: the group's rebalance has not completed, so nothing of the group is processed. A
# join takes seconds on Apache Kafka (a session timeout at most); a rebalance waits up to
# ``max.poll.interval.ms`` (5 min) for a member that does not rejoin (one stuck in a provider
# call), and librdkafka raises no error meanwhile, so the runner says so.
JOIN_OVERDUE_S = 60.0
# Latency settings (``checkpoint.PRODUCER_LATENCY`` for the producer): the consumer's fetch
# is answered as soon as one byte is there (``fetch.min.bytes``), and an empty one returns
# after ``fetch.wait.max.ms``; ``consumer_overrides`` win.
CONSUMER_LATENCY: dict[str, Any] = {
    "fetch.min.bytes": 1,
    "fetch.wait.max.ms": 100,
    "socket.nagle.disable": True,
}
# A unit of work's record: (topic, key, value, headers beyond the transaction's token).
_Record = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]
_Unit = UnitOfWork[Key, _Record]


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
        self._watchdog = watchdog
        self._tracing = tracing  # spans around handle and follow_up (ADR 0036); None: off
        self._on_views = on_views
        self._before_batch = before_batch
        self._codec = codec
        self._views = views if views is not None else ViewCodec.default()
        self._topics = topics
        self._clock = clock
        self._batch_size = batch_size
        self._batch_timeout_s = batch_timeout_ms / 1000
        self._linger_s = batch_linger_ms / 1000
        self._max_retries = max_retries
        self._inputs = {topics.physical(t): t for t in sorted(process.inputs)}
        self._changelog = topics.changelog(process.name)

        def new_producer() -> Producer:
            return make_producer(
                bootstrap,
                topics.transactional_id(process.name, instance_id),
                **{**PRODUCER_LATENCY, "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS},
            )

        # Dynamic membership (ADR 0015): a lost instance's partitions move to the others
        # once it misses ``session.timeout.ms``; a stopping one leaves the group at once.
        # ``client.id`` names the instance in the group's member list.
        overrides: dict[str, Any] = {**GROUP_SETTINGS, "client.id": f"{process.name}.{instance_id}"}
        overrides.update(CONSUMER_LATENCY)
        overrides.update(consumer_overrides or {})
        self._consumer: Consumer = make_consumer(bootstrap, topics.group(process.name), **overrides)
        # Never subscribed: the group's metadata with no member and no generation, which
        # the placeholder transaction of a new producer commits under (``_init_producer``).
        self._no_member = make_consumer(bootstrap, topics.group(process.name))
        self._checkpoint = Checkpoint(
            new_producer, self._consumer, self._no_member, next(iter(self._inputs)),
            f"{instance_id}.{uuid.uuid4().hex[:12]}", transaction_gap_ms / 1000, watchdog,
        )  # fmt: skip
        self._reader = ChangelogReader(bootstrap)
        self._partitions = OwnedPartitions(
            Path(state_dir) / process.name, self._changelog, list(self._inputs)
        )
        self._pending_assignment: list[int] | None = None
        self._join_overdue_s = join_overdue_s
        self._joining_since: float | None = None  # time.monotonic(); None once assigned
        self._needs_recover = False
        self._rewind_pending = False
        self._failures = 0
        self._stalled_since = stalled_since  # time.time() of the first failure, if any
        self._initial_blob = process.dump_state(process.initial_state())
        self._reacts_to = reacts_to(process)
        self._immutable = keeps_states_immutable(process)
        # key -> (committed state object, its bytes). A transaction takes an entry out
        # (processes may mutate the object) and only a commit puts it back, so an aborted
        # transaction never leaves uncommitted state here.
        # Committed state objects kept between transactions (saves a ``load_state`` per
        # event of a recently touched key; ``unit_of_work.STATE_CACHE_KEYS``).
        self._cache: StateCache[Key] = StateCache()
        # Input positions of no-op cycles not committed yet, and since when (``_commit``).
        self._deferred: dict[tuple[str, int], int] = {}
        self._deferred_since = 0.0
        self._started = False

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Fence older incarnations (aborting their open transaction) and join the group."""
        if self._started:
            return
        self._checkpoint.init()
        self._consumer.subscribe(
            list(self._inputs),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        self._joining_since = time.monotonic()
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
            self._no_member.close,
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
            msgs = self._consume()
            if self._before_batch is not None:
                self._before_batch()
            self._warn_if_join_overdue()
            if self._pending_assignment is not None:
                self._take_ownership(self._pending_assignment)
            if self._needs_recover:
                self._recover_all()
            now = self._clock()
            unit, positions = self._unit(), dict[tuple[str, int], int]()
            for msg in msgs:
                self._handle_record(unit, positions, msg, now)
            self._fire_due(unit, now)
            self._commit(unit, positions)
            self._follow_up(unit, now)
            self._failures = 0
        except Exception as exc:
            self._after_failure(exc)
        return len(msgs)

    def _consume(self) -> list[Message]:
        timeout, due = self._batch_timeout_s, self._partitions.next_due()
        if due is not None:
            timeout = max(0.0, min(timeout, (due - self._clock()) / 1000))
        msgs: list[Message] = self._consumer.consume(1, timeout)
        if msgs and self._batch_size > 1:
            linger = self._linger_s
            if linger and due is not None:  # a timer due sooner is not held back
                linger = max(0.0, min(linger, (due - self._clock()) / 1000))
            # Returns when the batch is full or ``linger`` has passed.
            msgs += self._consumer.consume(self._batch_size - 1, linger)
        return msgs

    def _handle_record(
        self, unit: _Unit, positions: dict[tuple[str, int], int], msg: Message, now: int
    ) -> None:
        err = msg.error()
        if err is not None:
            if err.fatal():
                raise KafkaException(err)
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("%s: consumer error %s", self.process.name, err)
            return
        topic, partition, offset = position(msg)
        if self._partitions.handled(topic, partition, offset):
            return  # not ours (any more), or already committed: fetched before a rebalance
        positions[(topic, partition)] = offset + 1
        logical = self._inputs[topic]
        value = msg.value() or b""
        if self._reacts_to is not None:
            kind = self._codec.event_class_of(value)
            if kind is not None and logical == kind.TOPIC and kind not in self._reacts_to:
                # Consumed and committed undecoded: ``handle`` would change nothing. A corrupt
                # body is dead-lettered by the readers that react to its type (every type of
                # every topic has one: tests/unit/test_reacts_to.py); a type on the wrong
                # topic, or an unknown header, is decoded and dead-lettered below.
                return
        # Deterministic id: a re-run after an abort or crash cannot mint a second one. Every
        # process reading the topic dead-letters the record: readers dedupe by event_id.
        source = (logical, partition, offset)
        dead_id = f"dead-letter-{logical}-{partition}-{offset}"
        try:
            event = engine.decode_input(self._codec.decode, value, logical)
            if msg.key() != event.partition_key.encode():
                # Its state lives under partition_key: on another partition it would split.
                raise MalformedEvent("record key is not the event's partition_key")
        except MalformedEvent as exc:
            raw_key = msg.key()
            keys = ("", (raw_key or b"").decode("utf-8", "replace"))
            dead = engine.malformed(
                dead_id, source, value, keys, self.process.name, exc.reason, now
            )
            # keyed by the record's own key, whatever its bytes
            dead_topic = self._topics.physical(dead.TOPIC)
            unit.records.append((dead_topic, raw_key, self._codec.encode(dead), []))
            self._send(unit)
            return
        if not engine.reacts(self._reacts_to, event):
            return  # consumed and committed; ``handle`` would change nothing (reacts_to)
        key = (partition, event.partition_key)
        tracing = self._tracing
        if tracing is not None and not tracing.follows(self.process.name):
            tracing = None
        # A transient failure propagates: abort, rewind, retry (``_after_failure``).
        load = partial(unit.get, key, self._partitions.read)
        traceparent = partial(traceparent_of, msg)
        failure = engine.handle_input(unit, key, event, now, load, tracing, traceparent)
        if failure is not None:
            name = self.process.name
            engine.add_dropped(
                unit, engine.dropped(dead_id, source, value, event, failure, name, now)
            )
        self._send(unit)

    # --- state and outputs -----------------------------------------------------------------

    def _unit(self) -> _Unit:
        return UnitOfWork(
            self.process, self._record, self._cache, self._immutable, self._on_views is not None
        )

    def _record(self, out: Output) -> _Record:
        """The Kafka record of an output: an event to its topic keyed by ``partition_key``
        (with the invocation's trace context, when traced), a view record to its view's
        topic keyed by view key (Avro of the view's schema; None: a tombstone) with its
        tenant, when known, in a header."""
        if isinstance(out, ViewRecord):
            value = None if out.value_json is None else self._views.encode(out.view, out.value_json)
            tenant = [(HEADER_TENANT, out.tenant.encode())] if out.tenant else []
            return self._topics.view(out.view), out.key.encode(), value, tenant
        trace: list[tuple[str, bytes]] = []
        if self._tracing is not None:  # the invocation's context travels on
            traceparent = self._tracing.of(out.invocation_id)
            if traceparent is not None:
                trace = [(TRACEPARENT, traceparent.encode())]
        encoded = self._codec.encode(out)
        return self._topics.physical(out.TOPIC), out.partition_key.encode(), encoded, trace

    def _send(self, unit: _Unit) -> None:
        """Produce what the unit holds into the open transaction (begun by the first): the
        producer sends it within a millisecond, while the next records are handled."""
        for topic, key, value, extra in unit.records:
            self._checkpoint.produce(topic, key, value, headers=extra)
        unit.records = []

    def _commit(self, unit: _Unit, positions: Mapping[tuple[str, int], int]) -> None:
        """Steps 4-7 of the commit sequence.

        A cycle that emitted nothing and changed no state (most cycles of the pending and
        decisions projections, many of the executor's) does not commit on its own: its input
        positions go with the next transaction, or are committed by the first cycle
        ``NOOP_COMMIT_DELAY_S`` after the oldest of them. Not when the runner falls idle:
        between two calls at low load it is idle after nearly every record, and those
        offsets-only transactions were more than a quarter of a deployment's transactions at
        20 proposals/s (docs/benchmarks.md, "Broker work per proposal"). Exactly-once holds:
        every commit carries all deferred positions, so an uncommitted deferred record was
        handled against the state that is still the committed one, and handling it again
        after a rewind is again a no-op.
        """
        self._send(unit)
        changes = unit.changes(self._initial_blob)
        checkpoint = self._checkpoint
        if not (checkpoint.token is not None or changes):
            if positions and not self._deferred:
                self._deferred_since = time.monotonic()
            self._deferred.update(positions)
            unit.committed()  # unchanged: still the committed states
            due = time.monotonic() - self._deferred_since >= NOOP_COMMIT_DELAY_S
            if not self._deferred or not due:
                return
        positions = {**self._deferred, **positions}
        bounds: dict[int, int] = {}
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                _, partition, offset = position(msg)
                bounds[partition] = max(bounds.get(partition, 0), offset + 1)

        blobs: dict[int, dict[str, bytes]] = {}
        for (partition, key), blob, _ in changes:
            blobs.setdefault(partition, {})[key] = blob
        stores = self._partitions.stores
        for partition, changed in blobs.items():
            prev = [(HEADER_PREV, stores[partition].head.encode())]
            for key, blob in changed.items():
                checkpoint.produce(self._changelog, key.encode(), blob, partition, prev, delivered)
        checkpoint.flush()
        if errors:
            raise KafkaException(errors[0])
        offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        offsets += [TopicPartition(self._changelog, p, o) for p, o in bounds.items()]
        token = checkpoint.commit(offsets)
        if self._stalled_since is not None:
            log.warning(
                "%s: resumed: a transaction committed %.1f s after it stopped making progress",
                self.process.name, time.time() - self._stalled_since,
            )  # fmt: skip
            self._stalled_since = None
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

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Restored after consume() returns, before any record of the batch is handled.
        self._pending_assignment = sorted({tp.partition for tp in partitions})
        self._joining_since = None

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Called only inside consume(), where no transaction is open.
        self._pending_assignment = None
        self._close_stores()
        self._joining_since = time.monotonic()

    def _warn_if_join_overdue(self) -> None:
        """Say once per join that the group has not assigned this runner anything yet."""
        if self._joining_since is None:
            return
        waited = time.monotonic() - self._joining_since
        if waited < self._join_overdue_s:
            return
        self._joining_since = None  # once; the next revocation starts another wait
        log.warning(
            "%s: no partitions assigned %.0f s after joining group %s: its rebalance has not "
            "completed and none of its input is processed (a member may be holding it up "
            "past max.poll.interval.ms)",
            self.process.name, waited, self._topics.group(self.process.name),
        )  # fmt: skip

    def _close_stores(self) -> None:
        self._partitions.close()
        self._cache.clear()
        self._deferred.clear()

    def _take_ownership(self, partitions: list[int]) -> None:
        self._pending_assignment = None
        self._close_stores()
        self._partitions.take(partitions)
        self._restore()
        self._needs_recover = self.process.recovers

    def _restore(self) -> None:
        """Bring the owned partitions up to what the broker committed (``partitions``)."""
        self._cache.clear()
        process = self.process

        def next_due(blob: bytes) -> int | None:
            return process.next_due(process.load_state(blob))

        self._partitions.restore(self._reader, self._consumer, next_due, self._checkpoint.bounded)

    def _recover_all(self) -> None:
        """``recover`` every stored key, in transactions of ``batch_size`` keys.

        Keys are read lazily (a RocksDB iterator reads a consistent snapshot while the
        commits below write), so memory does not grow with the number of stored keys."""
        now = self._clock()
        for partition, store in sorted(self._partitions.stores.items()):
            items = store.items()
            while chunk := list(itertools.islice(items, self._batch_size)):
                unit = self._unit()
                engine.recover_keys(unit, (((partition, pkey), blob) for pkey, blob in chunk), now)
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
        self._failures += 1
        if self._stalled_since is None:
            self._stalled_since = time.time()
        self._deferred.clear()  # rewound to the committed positions: re-read, no-ops again
        log.warning("%s: transaction failed (%r), rewinding", self.process.name, exc)
        self._checkpoint.abort()
        if self._failures > self._max_retries:
            raise exc
        time.sleep(min(5.0, 0.05 * 2**self._failures))
        self._rewind_pending = True

    def _rewind(self) -> None:
        """Restore state to the committed changelog and seek inputs to committed positions."""
        if self._partitions.stores:
            self._restore()
            self._partitions.seek(self._consumer)
            self._needs_recover = self.process.recovers
        self._rewind_pending = False
