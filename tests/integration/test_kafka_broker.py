"""What Apache Kafka does where callgate's Kafka adapter depends on it: ``read_committed``
hides the records of an aborted transaction, ListOffsets(latest) is the log end, and the
partition-EOF read finds every record."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from tests.kafka_support import Broker

from callgate.adapters.kafka.client import make_producer, read_partition_to_end

pytestmark = pytest.mark.kafka


def fresh_topic(broker: Broker) -> str:
    topic = f"t-broker-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    return topic


def test_read_committed_and_aborted_transactions(kafka_broker: Broker) -> None:
    """Two committed records around an aborted one: a ``read_committed`` reader sees the
    two."""
    topic = fresh_topic(kafka_broker)
    producer = make_producer(kafka_broker.bootstrap, f"{topic}.txn")
    producer.init_transactions(30)
    for value, commit in ((b"first", True), (b"aborted", False), (b"second", True)):
        producer.begin_transaction()
        producer.produce(topic, key=b"k", value=value, partition=0)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    seen = [r.value for r in read_partition_to_end(kafka_broker.bootstrap, topic, 0)]
    assert seen == [b"first", b"second"]


def test_latest_offset_is_the_log_end(kafka_broker: Broker) -> None:
    """Five records in one batch: ListOffsets(latest) is 5, and the EOF read finds all
    five."""
    topic = fresh_topic(kafka_broker)
    producer = make_producer(kafka_broker.bootstrap, None, **{"linger.ms": 100})
    for i in range(5):
        producer.produce(topic, key=b"k", value=str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": topic})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), 30, cached=False)
    finally:
        consumer.close()
    assert high == 5
    assert len(read_partition_to_end(kafka_broker.bootstrap, topic, 0)) == 5
