"""One transactional hop, timed step by step: ``python -m tools.bench_txn``.

Where a Kafka transaction's time goes on an Apache Kafka broker of its own, as
``KafkaRunner`` spends it per cycle: the first produce of a 400-byte record and its flush
(with librdkafka's ``AddPartitionsToTxn``), ``send_offsets_to_transaction``,
``commit_transaction``, and the hand-off: until a ``read_committed`` consumer has the
record. ``--gap-ms`` waits that long after each commit before the next transaction begins
(the runner's ``TRANSACTION_GAP_MS``, docs/adr/0020-transaction-gap.md); ``--no-hand-off``
begins the next transaction right after the commit instead of after the hand-off, as a
runner with records waiting does. Figures: docs/explanation/benchmarks.md "The critical path".
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from callgate.adapters.kafka.checkpoint import PRODUCER_LATENCY
from callgate.adapters.kafka.consumer import CONSUMER_LATENCY
from tools.apache_kafka import ApacheKafka

STEPS = ("produce + flush", "send offsets", "commit", "hand-off")
WARM_UP = 20  # transactions left out of the figures (coordinator lookups, a cold JVM)


@contextmanager
def _broker(kind: str) -> Iterator[str]:
    with ApacheKafka() as server:
        yield server.bootstrap


def time_transactions(
    bootstrap: str, transactions: int, gap_ms: float, hand_off: bool, prefix: str = "bench-txn"
) -> dict[str, list[float]]:
    """ms per step (``STEPS``) of each transaction after the warm-up, on topics, group and
    transactional id named after ``prefix``."""
    source, sink = f"{prefix}.in", f"{prefix}.out"
    quiet = {"log_level": 0}
    admin = AdminClient({"bootstrap.servers": bootstrap, **quiet})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in (source, sink)]).values():
        future.result()
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": prefix} | PRODUCER_LATENCY | quiet
    )
    producer.init_transactions(60)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": prefix,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
        | CONSUMER_LATENCY
        | quiet
    )
    consumer.assign([TopicPartition(sink, 0, 0)])
    steps: dict[str, list[float]] = {step: [] for step in STEPS}
    try:
        for i in range(WARM_UP + transactions):
            t0 = time.perf_counter()
            producer.begin_transaction()
            producer.produce(sink, key=b"k", value=b"x" * 400)
            producer.flush(30)
            t1 = time.perf_counter()
            group = consumer.consumer_group_metadata()
            producer.send_offsets_to_transaction([TopicPartition(source, 0, i + 1)], group, 30)
            t2 = time.perf_counter()
            producer.commit_transaction(30)
            t3 = time.perf_counter()
            while hand_off:
                msg = consumer.poll(5)
                if msg is not None and msg.error() is None:
                    break
            t4 = time.perf_counter()
            if i >= WARM_UP:
                for step, (a, b) in zip(
                    STEPS, ((t0, t1), (t1, t2), (t2, t3), (t3, t4)), strict=True
                ):
                    steps[step].append((b - a) * 1000)
            if gap_ms > 0:
                time.sleep(gap_ms / 1000)
    finally:
        consumer.close()
        producer.flush(10)
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time one transactional hop step by step.")
    parser.add_argument("--broker", choices=["apache"], default="apache")
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=0.0)
    parser.add_argument("--no-hand-off", dest="hand_off", action="store_false")
    ns = parser.parse_args(argv)
    with _broker(ns.broker) as bootstrap:
        steps = time_transactions(bootstrap, ns.transactions, ns.gap_ms, ns.hand_off)
    print(
        f"{ns.broker}: {ns.transactions} transactions, gap {ns.gap_ms:g} ms, "
        f"hand-off {'waited for' if ns.hand_off else 'not waited for'}; median / p99 ms"
    )
    for step, xs in steps.items():
        if ns.hand_off or step != "hand-off":
            p99 = sorted(xs)[max(0, round(0.99 * len(xs)) - 1)]
            print(f"  {step:16s} {statistics.median(xs):7.2f} / {p99:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
