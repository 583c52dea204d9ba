"""The SDK backend over Kafka: publish requests, read the compacted view topics.

Views are read into a local table by one consumer assigned to every partition of
every view topic from the beginning (the read model an approval UI keeps); a
tombstone removes a key. The end of a partition is detected with
``enable.partition.eof`` (tansu's latest-offset answer is not the log end).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
from callgate.adapters.kafka.client import (
    LIBRDKAFKA_LOG,
    PublishFailed,
    broker_unavailable,
    make_producer,
    not_deployed,
    position,
    probe,
    publish,
    read_partitions_to_end,
)
from callgate.adapters.kafka.serve import views_of
from callgate.adapters.kafka.topics import Topics
from callgate.bootstrap import App
from callgate.domain.events import Event


class KafkaBackend:
    def __init__(self, app: App) -> None:
        settings = app.settings
        if not settings.bootstrap_servers:
            raise ValueError("the Kafka backend needs bootstrap servers")
        self.app = app
        self.bootstrap = settings.bootstrap_servers
        self.timeout_s = settings.timeout_s
        # Fail fast and coded (``broker_unavailable``) when no broker answers, instead of
        # librdkafka retrying a record for minutes.
        existing = probe(self.bootstrap, self.timeout_s)
        self.topics = Topics(settings.topic_prefix, settings.partitions)
        if (requests := self.topics.physical("requests")) not in existing:
            raise not_deployed(self.bootstrap, requests)
        self.codec = AvroCodec.default()
        timeouts: dict[str, Any] = {"message.timeout.ms": max(1000, int(self.timeout_s * 1000))}
        self._producer = make_producer(self.bootstrap, None, **timeouts)
        self._views: dict[str, dict[str, str]] = {v: {} for v in views_of(app)}
        self._by_topic = {self.topics.view(v): v for v in self._views}
        self._consumer: Consumer | None = None

    # -- publishing ----------------------------------------------------------------------

    def publish(self, events: Sequence[Event]) -> None:
        try:
            publish(self._producer, self.codec, self.topics, events, self.timeout_s)
        except PublishFailed as exc:
            raise broker_unavailable(self.bootstrap, self.timeout_s, str(exc)) from None

    # -- the read model --------------------------------------------------------------------

    def _open(self) -> Consumer:
        if self._consumer is not None:
            return self._consumer
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "logger": LIBRDKAFKA_LOG,
                "group.id": "callgate.surfaces.sdk-reader",  # never joined, never committed
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                # An empty partition would otherwise hold each catch-up fetch for 500 ms.
                "fetch.wait.max.ms": 50,
            }
        )
        assignment: list[TopicPartition] = []
        try:
            meta = consumer.list_topics(timeout=self.timeout_s)
        except KafkaException as exc:
            consumer.close()
            raise broker_unavailable(self.bootstrap, self.timeout_s, str(exc)) from None
        for topic in self._by_topic:
            info = meta.topics.get(topic)
            if info is None or info.error is not None:
                consumer.close()
                raise not_deployed(self.bootstrap, topic)
            assignment += [TopicPartition(topic, p, 0) for p in sorted(info.partitions)]
        consumer.assign(assignment)
        self._consumer = consumer
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
                self._views[view].pop(key, None)
            else:
                self._views[view][key] = value.decode()
        return ended

    def _refresh(self, timeout_s: float = 0.0) -> None:
        consumer = self._open()
        self._pump(consumer, timeout_s)

    def view(self, view: str, key: str) -> dict[str, Any] | None:
        self._refresh()
        raw = self._views.get(view, {}).get(key)
        return None if raw is None else _obj(raw)

    def view_items(self, view: str) -> list[tuple[str, dict[str, Any]]]:
        return [(k, _obj(v)) for k, v in self.view_items_raw(view)]

    def view_items_raw(self, view: str) -> list[tuple[str, str]]:
        self._refresh(0.1)
        return sorted(self._views.get(view, {}).items())

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        consumer = self._open()
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            self._pump(consumer, 0.05)
        return True

    def read_events(self) -> Iterator[Event]:
        """The ``events`` topic from offset 0 to its end, partition by partition.

        Read as the projections read it (``read_committed``), so a replay folds exactly
        what the live projections folded.
        """
        events = self.topics.physical("events")
        for record in read_partitions_to_end(self.bootstrap, events, timeout_s=120):
            if record.value is None:
                continue
            try:
                event = self.codec.decode(record.value)
            except MalformedEvent:
                continue  # dead-lettered by the runners, never folded by a projection
            if type(event).TOPIC == "events":
                yield event

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._producer.flush(min(10.0, self.timeout_s))


def _obj(raw: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(raw)
    return value
