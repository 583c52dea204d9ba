"""Small confluent-kafka helpers shared by the runner, the CLI/SDK clients and the tests.

Every producer uses the ``murmur2_random`` partitioner (the Java client's) and keys records by
``partition_key``, so clients, services and other-language tools agree on partitions
(co-partitioning, see ``topics``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from callgate.adapters.kafka.topics import Topics
from callgate.domain.events import Event
from callgate.domain.limits import check_record_size

Config = dict[str, Any]

# Group settings for tests on tansu, whose group joins take about ``session.timeout.ms``
# (DESIGN "Known tansu gaps"). Production keeps the Kafka defaults.
FAST_GROUP_SETTINGS: Config = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


class EventCodec(Protocol):
    """The Avro codec's interface (``callgate.adapters.avro_codec.AvroCodec``)."""

    def encode(self, event: Event) -> bytes: ...

    def decode(self, data: bytes) -> Event: ...


class PublishFailed(RuntimeError):
    """The broker did not acknowledge every record."""


@dataclass(frozen=True, slots=True)
class Record:
    """A consumed record, detached from librdkafka."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


def make_producer(
    bootstrap: str, transactional_id: str | None = None, **overrides: Any
) -> Producer:
    """An idempotent producer (transactional when ``transactional_id`` is given)."""
    config: Config = {
        "bootstrap.servers": bootstrap,
        "partitioner": "murmur2_random",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
    }
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    config.update(overrides)
    return Producer(config)


def make_consumer(bootstrap: str, group: str, **overrides: Any) -> Consumer:
    """A consumer that never commits by itself and reads only committed transactions.

    ``range`` assignment gives one member the same partition numbers of every input topic
    (co-partitioning); cooperative-sticky does not promise that.
    """
    config: Config = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "range",
    }
    config.update(overrides)
    return Consumer(config)


def publish(
    producer: Producer, codec: EventCodec, topics: Topics, events: Iterable[Event]
) -> list[tuple[str, int, int]]:
    """Publish events (clients: CLI, SDK) keyed by ``partition_key``; wait for the acks.

    Returns ``(topic, partition, offset)`` per event, in order. Raises ``PublishFailed``, or
    ``Rejection(invalid_arguments)`` for a record over ``limits.MAX_RECORD_BYTES`` (checked
    before anything is produced, so the client library never refuses it with a raw error).
    """
    results: list[tuple[str, int, int] | KafkaError | None] = []

    def on_delivery(index: int) -> Any:
        def callback(err: KafkaError | None, msg: Message) -> None:
            results[index] = err if err is not None else position(msg)

        return callback

    encoded = [(event, codec.encode(event)) for event in events]
    for _, value in encoded:  # a coded refusal, not the client library's raw exception
        check_record_size(len(value))
    for event, value in encoded:
        results.append(None)
        topic = topics.physical(event.TOPIC)
        _produce(
            producer, topic, event.partition_key.encode(), value, on_delivery(len(results) - 1)
        )
    producer.flush()
    delivered: list[tuple[str, int, int]] = []
    for result in results:
        if not isinstance(result, tuple):
            raise PublishFailed(f"record not acknowledged: {result}")
        delivered.append(result)
    return delivered


def _produce(producer: Producer, topic: str, key: bytes, value: bytes, callback: Any) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value, on_delivery=callback)
            return
        except BufferError:  # local queue full: let deliveries drain
            producer.poll(0.1)


def read_partitions_to_end(
    bootstrap: str,
    topic: str,
    partitions: Sequence[int] | None = None,
    *,
    start: int = 0,
    isolation: str = "read_committed",
    timeout_s: float = 30.0,
) -> list[Record]:
    """Every record of ``topic`` (all partitions unless given) from ``start`` to the end.

    The end is the partition EOF event (``enable.partition.eof``), NOT the watermark: tansu's
    ListOffsets for the latest offset returns the base offset of the last record batch, while
    its fetch responses carry the right high watermark. Records come in offset order per
    partition. Raises ``TimeoutError`` if a partition never reports its end.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "callgate.reader",  # required by librdkafka; never joined or committed
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    try:
        if partitions is None:
            meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
            if meta.error is not None:
                raise KafkaException(meta.error)
            partitions = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, start) for p in partitions])
        return _drain(consumer, set(partitions), timeout_s)
    finally:
        consumer.close()


def read_partition_to_end(
    bootstrap: str, topic: str, partition: int, **kwargs: Any
) -> list[Record]:
    """``read_partitions_to_end`` for one partition."""
    return read_partitions_to_end(bootstrap, topic, [partition], **kwargs)


def position(msg: Message) -> tuple[str, int, int]:
    """A fetched record's topic, partition and offset (librdkafka sets all three on one)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise KafkaException(KafkaError(KafkaError._BAD_MSG, "record without a position"))
    return topic, partition, offset


def headers_of(msg: Message) -> list[tuple[str, bytes]]:
    """A record's headers as bytes (callgate writes bytes; a missing value reads as empty)."""
    raw = msg.headers() or ()
    items = raw.items() if isinstance(raw, dict) else raw
    return [(k, v.encode() if isinstance(v, str) else (v or b"")) for k, v in items]


def fetched(consumer: Consumer, timeout_s: float) -> list[Message]:
    """What is fetched already (no waiting for a full batch), else the next message to
    arrive within ``timeout_s``; ``[]`` when none did. ``consume(n, t)`` would wait for all
    ``n`` messages or the whole timeout."""
    msgs: list[Message] = consumer.consume(1000, 0)
    if not msgs:
        msg = consumer.poll(timeout_s)
        msgs = [msg] if msg is not None else []
    return msgs


def _drain(consumer: Consumer, pending: set[int], timeout_s: float) -> list[Record]:
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions {sorted(pending)} never reached their end")
        for msg in fetched(consumer, 0.1):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    topic, partition, _ = position(msg)
                    pending.discard(partition)
                    consumer.pause([TopicPartition(topic, partition)])
                    continue
                raise KafkaException(err)
            records.append(to_record(msg))
    return records


def to_record(msg: Message) -> Record:
    topic, partition, offset = position(msg)
    return Record(topic, partition, offset, msg.key(), msg.value(), dict(headers_of(msg)))
