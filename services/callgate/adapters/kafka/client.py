"""Small confluent-kafka helpers shared by the runner, the CLI/SDK clients and the tests.

Every producer uses the ``murmur2_random`` partitioner (the Java client's) and keys records by
``partition_key``, so clients, services and other-language tools agree on partitions
(co-partitioning, see ``topics``).

Every client is made from ``client_config``: it gets the connection's TLS/SASL settings
(``Brokers``) and ``LIBRDKAFKA_LOG`` as its ``logger``:
librdkafka then hands its log lines to Python logging instead of writing them to stderr,
and the command line shows them only with ``-v`` (``callgate.logs``). A broker
that does not answer is reported once, by ``probe``, as ``broker_unavailable``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from callgate.adapters.kafka.connection import BrokerAddress, properties_of, servers_of
from callgate.adapters.kafka.topics import Topics
from callgate.domain.codes import Code, Rejection
from callgate.domain.events import Event
from callgate.domain.limits import check_record_size
from callgate.tracing import TRACEPARENT

Config = dict[str, Any]

# Where librdkafka's own log lines go (the name is ``callgate.logs.LIBRDKAFKA_LOGGER``).
LIBRDKAFKA_LOG = logging.getLogger("callgate.librdkafka")


def client_config(bootstrap: BrokerAddress, **settings: Any) -> Config:
    """The settings every callgate client starts from: the brokers, their connection
    properties (``kafka_client``, carried by ``Brokers``) and the Python logger."""
    return {
        "bootstrap.servers": servers_of(bootstrap),
        "logger": LIBRDKAFKA_LOG,
        **properties_of(bootstrap),
        **settings,
    }


def make_admin(bootstrap: BrokerAddress, **overrides: Any) -> AdminClient:
    return AdminClient(client_config(bootstrap, **overrides))


def broker_unavailable(bootstrap: BrokerAddress, timeout_s: float, detail: str = "") -> Rejection:
    """The coded error of a command whose broker did not answer (names the servers)."""
    why = f" ({detail})" if detail else ""
    return Rejection(
        Code.BROKER_UNAVAILABLE,
        f"no Kafka broker answered at {bootstrap} within {timeout_s:g}s{why}",
        {"bootstrap_servers": servers_of(bootstrap)},
    )


def probe(bootstrap: BrokerAddress, timeout_s: float) -> set[str]:
    """The broker's topic names; raise ``broker_unavailable`` unless a broker at
    ``bootstrap`` answers a metadata request within ``timeout_s``. Commands call this
    first: librdkafka itself would retry for minutes (``message.timeout.ms`` is 5 minutes)
    before giving up on a record."""
    # An authentication or TLS failure reaches ``error_cb`` only; it is the reason to give.
    refused: list[str] = []

    def on_error(err: KafkaError) -> None:
        if err.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            refused.append(err.str())

    admin = make_admin(
        bootstrap, **{"socket.connection.setup.timeout.ms": _ms(timeout_s), "error_cb": on_error}
    )
    failed: KafkaException | None = None
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        failed = exc
    finally:
        # Serves ``error_cb`` and hands librdkafka's queued log lines to ``LIBRDKAFKA_LOG``.
        admin.poll(0)
    if failed is not None:
        raise broker_unavailable(bootstrap, timeout_s, (refused or [_reason(failed)])[-1])
    if not metadata.brokers:
        raise broker_unavailable(bootstrap, timeout_s, "metadata named no broker")
    return set(metadata.topics)


def not_deployed(bootstrap: BrokerAddress, topic: str) -> Rejection:
    """The coded error of a client whose deployment's topics are not on the broker."""
    return Rejection(
        Code.NOT_FOUND,
        f"no topic {topic} at {bootstrap}: `callgate serve` creates a deployment's topics "
        "(check CALLGATE_TOPIC_PREFIX and that serve has run against these servers)",
        {"topic": topic},
    )


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _reason(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


# Group settings for tests: Apache Kafka moves a lost member's partitions after
# ``session.timeout.ms``, so a shorter one shortens the failover tests wait for. The
# runners' own defaults are ``consumer.GROUP_SETTINGS`` (ADR 0015).
FAST_GROUP_SETTINGS: Config = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


class EventCodec(Protocol):
    """The Avro codec's interface (``callgate.adapters.avro_codec.AvroCodec``)."""

    def encode(self, event: Event) -> bytes: ...

    def decode(self, data: bytes) -> Event: ...

    def event_class_of(self, data: bytes) -> type[Event] | None: ...


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
    bootstrap: BrokerAddress, transactional_id: str | None = None, **overrides: Any
) -> Producer:
    """An idempotent producer (transactional when ``transactional_id`` is given)."""
    config = client_config(
        bootstrap,
        **{
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        },
    )
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    config.update(overrides)
    return Producer(config)


def make_consumer(bootstrap: BrokerAddress, group: str, **overrides: Any) -> Consumer:
    """A consumer that never commits by itself and reads only committed transactions.

    ``range`` assignment gives one member the same partition numbers of every input topic
    (co-partitioning); cooperative-sticky does not promise that.
    """
    config = client_config(
        bootstrap,
        **{
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "range",
        },
    )
    config.update(overrides)
    return Consumer(config)


def publish(
    producer: Producer,
    codec: EventCodec,
    topics: Topics,
    events: Iterable[Event],
    timeout_s: float | None = None,
    traceparent: str | None = None,
) -> list[tuple[str, int, int]]:
    """Publish events (clients: CLI, SDK) keyed by ``partition_key``; wait for the acks.

    Returns ``(topic, partition, offset)`` per event, in order. Raises ``PublishFailed``
    (also when the acks did not all come within ``timeout_s``, if given), or
    ``Rejection(invalid_arguments)`` for a record over ``limits.MAX_RECORD_BYTES`` (checked
    before anything is produced, so the client library never refuses it with a raw error).
    ``traceparent``: the trace context the records carry, in the ``traceparent`` header
    (the messaging semantic conventions; ADR 0036).
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
            producer,
            topic,
            event.partition_key.encode(),
            value,
            on_delivery(len(results) - 1),
            None if traceparent is None else [(TRACEPARENT, traceparent.encode())],
        )
    if timeout_s is None:
        producer.flush()
    elif producer.flush(timeout_s) > 0:
        raise PublishFailed(f"records not acknowledged within {timeout_s:g}s")
    delivered: list[tuple[str, int, int]] = []
    for result in results:
        if not isinstance(result, tuple):
            raise PublishFailed(f"record not acknowledged: {result}")
        delivered.append(result)
    return delivered


def traceparent_of(msg: Message) -> str | None:
    """The record's ``traceparent`` header (the invocation's trace context), if any."""
    headers = msg.headers() or []
    for name, value in headers.items() if isinstance(headers, dict) else headers:
        if name == TRACEPARENT and value:
            try:
                return value if isinstance(value, str) else value.decode("ascii")
            except UnicodeDecodeError:
                return None  # not a trace context: the span starts no trace from it
    return None


def _produce(
    producer: Producer,
    topic: str,
    key: bytes,
    value: bytes,
    callback: Any,
    headers: list[tuple[str, str | bytes | None]] | None = None,
) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value, on_delivery=callback, headers=headers)
            return
        except BufferError:  # local queue full: let deliveries drain
            producer.poll(0.1)


def committed_offsets(
    consumer: Consumer, partitions: Sequence[TopicPartition], timeout_s: float
) -> list[TopicPartition]:
    """The group's committed offsets of ``partitions``; raises ``KafkaException`` when the
    answer for any partition is an error. Its offset is ``OFFSET_INVALID`` then, the same
    as "nothing committed": read so, a runner would restore that partition's state as
    empty and handle its input again from the first record (after a broker restart, a
    whole history was decided and applied again that way)."""
    found: list[TopicPartition] = consumer.committed(list(partitions), timeout=timeout_s)
    for tp in found:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return found


def read_partitions_to_end(
    bootstrap: BrokerAddress,
    topic: str,
    partitions: Sequence[int] | None = None,
    *,
    start: int = 0,
    isolation: str = "read_committed",
    timeout_s: float = 30.0,
) -> list[Record]:
    """Every record of ``topic`` (all partitions unless given) from ``start`` to the end.

    The end is the partition EOF event (``enable.partition.eof``), NOT the watermark: on a
    transactional topic the offsets below the high watermark end with a commit marker, which
    no consumer is given, and a ``read_committed`` reader stops at the last stable offset;
    librdkafka's EOF accounts for both. Records come in offset order per partition. Raises
    ``TimeoutError`` if a partition never reports its end.
    """
    consumer = Consumer(
        client_config(
            bootstrap,
            **{
                "group.id": "callgate.reader",  # required by librdkafka; never joined/committed
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": isolation,
            },
        )
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
    bootstrap: BrokerAddress, topic: str, partition: int, **kwargs: Any
) -> list[Record]:
    """``read_partitions_to_end`` for one partition."""
    return read_partitions_to_end(bootstrap, topic, [partition], **kwargs)


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (Java ``Utils.murmur2``; librdkafka's ``murmur2_random`` for a
    non-null key), as an unsigned 32-bit value."""
    m, length = 0x5BD1E995, len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[length - length % 4 :]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h = ((h ^ tail[0]) * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


def partition_for(key: bytes, partitions: int) -> int:
    """The partition every callgate producer (``murmur2_random``) sends ``key`` to."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


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
