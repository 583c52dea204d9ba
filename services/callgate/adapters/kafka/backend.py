"""The SDK backend over Kafka: publish requests, follow them on ``events``, read views.

A call waits for its own request, never by re-reading views from the beginning (ADR 0016):
every event of its partition key lands on the partition number the key hashes to
(``murmur2_random``, co-partitioning: ``topics``), so before publishing it records that
``events`` partition's end offset (one ListOffsets request), checks that the request's
delivery report names the same partition, reads that one partition from the offset,
folds the events of its own partition key through the projection that writes the view it
waits on (the same projection code the service runs), and stops once the value
satisfies it. The cost is the
traffic on one partition while the call is in flight, whatever the history.

Starting early is safe, starting late would miss events; the fold skips an ``event_id`` it
has seen (a guard: ``read_committed`` already hides records of aborted transactions).

Queries of whole views (``pending``, ``audit``, ``status`` of any invocation) read the
compacted view topics they need, and only those, into a local table (Avro values decoded
with the published schemas); the end of a partition is detected with
``enable.partition.eof`` (``client.read_all``: commit markers make the high watermark no
record's offset).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
from callgate.adapters.kafka.client import (
    LIBRDKAFKA_LOG,
    PublishFailed,
    broker_unavailable,
    client_config,
    fetched,
    make_producer,
    not_deployed,
    partition_for,
    position,
    probe,
    publish,
    read_partitions_to_end,
)
from callgate.adapters.kafka.serve import writers_of
from callgate.adapters.kafka.topics import Topics
from callgate.adapters.view_codec import ViewCodec
from callgate.domain.events import Event
from callgate.domain.process_port import Process, ViewRecord
from callgate.settings import Settings

if TYPE_CHECKING:
    from callgate.tracing import Tracing

# The follower of a call in flight asks for new records this often at most. A
# ``read_committed`` fetch that the broker parks is not answered when a transaction's
# commit makes records visible, only when new bytes arrive or the wait ends: with 50 ms a
# call waited out most of a wait per commit it follows (two on its way), so the follower,
# which reads one partition and only while a call is in flight, asks every 5 ms instead.
FOLLOW_FETCH_WAIT_MS = 5
# How long approve/deny wait for a just-requested approval to reach the pending view.
PENDING_LOOKUP_S = 2.0
# Answers of a partition whose leader is not elected yet (just-created topics): ask again.
_ELECTING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})
_READER = {
    "logger": LIBRDKAFKA_LOG,
    "enable.auto.commit": False,
    "isolation.level": "read_committed",
    # An empty partition would otherwise hold each fetch for 500 ms.
    "fetch.wait.max.ms": 50,
}


class KafkaBackend:
    """The client's backend on a Kafka deployment: ``settings`` name it, ``projections``
    write the views it reads; ``tracing``: spans, or None."""

    def __init__(
        self,
        settings: Settings,
        projections: Sequence[Process[Any]],
        tracing: Tracing | None = None,
    ) -> None:
        if not settings.bootstrap_servers:
            raise ValueError("the Kafka backend needs bootstrap servers")
        self._projections = list(projections)
        self._tracing = tracing
        self.bootstrap = settings.brokers
        self.timeout_s = settings.timeout_s
        # Fail fast and coded (``broker_unavailable``) when no broker answers, instead of
        # librdkafka retrying a record for minutes.
        existing = probe(self.bootstrap, self.timeout_s)
        self.topics = Topics(settings.topic_prefix, settings.partitions)
        if (requests := self.topics.physical("requests")) not in existing:
            raise not_deployed(self.bootstrap, requests)
        self.codec = AvroCodec.default()
        self.views = ViewCodec.default()
        timeouts: dict[str, Any] = {"message.timeout.ms": max(1000, int(self.timeout_s * 1000))}
        self._producer = make_producer(self.bootstrap, None, **timeouts)
        self._writers = writers_of(self._projections)
        self._tables: dict[str, dict[str, str]] = {}  # opened views: key -> canonical JSON
        self._by_topic = {self.topics.view(v): v for v in self._writers}
        self._consumer: Consumer | None = None
        self._follower: Consumer | None = None
        self._offsets: Consumer | None = None

    # -- publishing ----------------------------------------------------------------------

    def publish(self, events: Sequence[Event]) -> None:
        try:
            publish(self._producer, self.codec, self.topics, events, self.timeout_s, self._trace())
        except PublishFailed as exc:
            raise broker_unavailable(self.bootstrap, self.timeout_s, str(exc)) from None

    def _trace(self) -> str | None:
        """The current span's context (the proposal's), for the records' header."""
        tracing = self._tracing
        return None if tracing is None else tracing.current()

    # -- following one request -------------------------------------------------------------

    def _log_end(self, reader: Consumer, where: TopicPartition) -> int:
        """The partition's log end, where a request's own events will start. A partition
        whose leader is still being elected (topics ``serve`` has just created) is asked
        again until the timeout; anything else is ``broker_unavailable`` at once."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = max(0.1, deadline - time.monotonic())
            try:
                return reader.get_watermark_offsets(where, timeout=left, cached=False)[1]
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                electing = isinstance(err, KafkaError) and err.code() in _ELECTING
                if not electing or time.monotonic() >= deadline:
                    raise broker_unavailable(self.bootstrap, self.timeout_s, str(exc)) from None
                time.sleep(0.1)

    def follow(
        self,
        request: Event,
        view: str,
        key: str,
        done: Callable[[dict[str, Any]], bool],
        timeout_s: float,
    ) -> dict[str, Any] | None:
        """Publish ``request``; the value ``view`` holds at ``key`` once ``done`` (or the
        last one seen at the timeout, ``None`` if none), from its own partition only."""
        events = self.topics.physical("events")
        pk = request.partition_key.encode()
        partition = partition_for(pk, self.topics.partitions)
        reader = self._follower_consumer()
        start = self._log_end(self._offsets_consumer(), TopicPartition(events, partition))
        try:
            ((_, delivered, _),) = publish(
                self._producer, self.codec, self.topics, [request], self.timeout_s, self._trace()
            )
        except PublishFailed as exc:
            raise broker_unavailable(self.bootstrap, self.timeout_s, str(exc)) from None
        if delivered != partition:  # a producer with another partitioner: co-partitioning broke
            raise RuntimeError(f"request went to partition {delivered}, expected {partition}")
        reader.assign([TopicPartition(events, partition, start)])
        projection = self._projection(view)
        state = projection.initial_state()
        seen: set[str] = set()
        value: dict[str, Any] | None = None
        deadline = time.monotonic() + timeout_s
        while True:
            for msg in fetched(reader, 0.05):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                if msg.key() != pk:
                    continue  # another partition key sharing the partition
                try:
                    event = self.codec.decode(msg.value() or b"")
                except MalformedEvent:
                    continue  # dead-lettered by the runners, never folded by a projection
                if type(event).TOPIC != "events" or event.event_id in seen:
                    continue
                seen.add(event.event_id)
                state, outputs = projection.handle(state, event, 0)
                for out in outputs:
                    if isinstance(out, ViewRecord) and out.view == view and out.key == key:
                        value = out.value
            if value is not None and done(value):
                return value
            if time.monotonic() > deadline:
                return value

    def _reader(self, role: str, **extra: Any) -> Consumer:
        """A ``read_committed`` client of this backend; its group is never joined or
        committed (librdkafka requires one)."""
        group = {"group.id": f"callgate.surfaces.sdk-{role}"}
        return Consumer(client_config(self.bootstrap, **{**_READER, **extra, **group}))

    def _follower_consumer(self) -> Consumer:
        if self._follower is None:
            self._follower = self._reader("follower", **{"fetch.wait.max.ms": FOLLOW_FETCH_WAIT_MS})
        return self._follower

    def _offsets_consumer(self) -> Consumer:
        """A client that only asks for log ends: never assigned, so its ``ListOffsets`` never
        queues behind a fetch the broker parks on the same connection (the follower's did,
        50 ms a call)."""
        if self._offsets is None:
            self._offsets = self._reader("offsets")
        return self._offsets

    def _projection(self, view: str) -> Process[Any]:
        for projection in self._projections:
            if view in getattr(projection, "views", ()):
                return projection
        raise ValueError(f"no projection writes view {view!r}")

    # -- the read model of whole views -----------------------------------------------------

    @property
    def views_read(self) -> frozenset[str]:
        """The views this client has read from the beginning so far (a call reads none)."""
        return frozenset(self._tables)

    def _open(self, views: Iterable[str]) -> Consumer:
        """The views' topics assigned from the beginning and read to their end once."""
        if self._consumer is None:
            self._consumer = self._reader("reader", **{"enable.partition.eof": True})
        consumer = self._consumer
        new = sorted(set(views) - set(self._tables))
        if not new:
            return consumer
        assignment: list[TopicPartition] = []
        try:
            meta = consumer.list_topics(timeout=self.timeout_s)
        except KafkaException as exc:
            raise broker_unavailable(self.bootstrap, self.timeout_s, str(exc)) from None
        for view in new:
            topic = self.topics.view(view)
            info = meta.topics.get(topic)
            if info is None or info.error is not None:
                raise not_deployed(self.bootstrap, topic)
            assignment += [TopicPartition(topic, p, 0) for p in sorted(info.partitions)]
            self._tables[view] = {}
        consumer.incremental_assign(assignment)
        pending = {(tp.topic, tp.partition) for tp in assignment}
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:  # catch up to the end once
            pending -= self._pump(consumer, 0.2)
        return consumer

    def _pump(self, consumer: Consumer, timeout_s: float) -> set[tuple[str, int]]:
        """Apply what has arrived; returns the partitions that reported their end."""
        ended: set[tuple[str, int]] = set()
        msgs = consumer.consume(1000, timeout_s)
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    ended.add(position(msg)[:2])
                    continue
                raise KafkaException(err)
            view = self._by_topic[position(msg)[0]]
            key = (msg.key() or b"").decode()
            value = msg.value()
            if value is None:
                self._tables[view].pop(key, None)
            else:
                self._tables[view][key] = self.views.decode_json(value)[1]
        return ended

    def _refresh(self, views: Iterable[str], timeout_s: float = 0.0) -> None:
        self._pump(self._open(views), timeout_s)

    def view(self, view: str, key: str) -> dict[str, Any] | None:
        self._refresh([view])
        raw = self._tables[view].get(key)
        return None if raw is None else _obj(raw)

    def partition_key_of(self, invocation_id: str) -> str | None:
        """From the pending view (what an approval UI holds; compacted, so bounded by what
        is pending), waiting briefly for an approval requested a moment ago; else from the
        status view (a call that is not pending: the decider answers ``not_pending``)."""
        record: dict[str, Any] | None = None

        def found() -> bool:
            nonlocal record
            record = self.view("pending", invocation_id)
            return record is not None

        if not self.wait(found, PENDING_LOOKUP_S):
            record = self.view("status", invocation_id)
        return None if record is None else str(record["partition_key"])

    def view_items(self, view: str) -> list[tuple[str, dict[str, Any]]]:
        return [(k, _obj(v)) for k, v in self.view_items_raw(view)]

    def view_items_raw(self, view: str) -> list[tuple[str, str]]:
        self._refresh([view], 0.1)
        return sorted(self._tables[view].items())

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Until ``predicate`` holds, taking in what the views opened so far receive."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            if self._consumer is not None and self._tables:
                self._pump(self._consumer, 0.05)
            else:
                time.sleep(0.05)
        return True

    def read_events(
        self, only: type[Event] | tuple[type[Event], ...] | None = None
    ) -> Iterator[Event]:
        """The ``events`` topic from offset 0 to its end, partition by partition.

        Read as the projections read it (``read_committed``), so a replay folds exactly
        what the live projections folded. ``only``: the events of that class, the others
        skipped by their header, undecoded (a tuple: of those classes).
        """
        classes = (only,) if isinstance(only, type) else only
        events = self.topics.physical("events")
        for record in read_partitions_to_end(self.bootstrap, events, timeout_s=120):
            if record.value is None:
                continue
            if classes is not None and self.codec.event_class_of(record.value) not in classes:
                continue
            try:
                event = self.codec.decode(record.value)
            except MalformedEvent:
                continue  # dead-lettered by the runners, never folded by a projection
            if type(event).TOPIC == "events":
                yield event

    def close(self) -> None:
        for consumer in (self._consumer, self._follower, self._offsets):
            if consumer is not None:
                consumer.close()
        self._consumer = self._follower = self._offsets = None
        self._producer.flush(min(10.0, self.timeout_s))


def _obj(raw: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(raw)
    return value
