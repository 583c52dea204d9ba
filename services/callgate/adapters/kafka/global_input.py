"""Control events every decider worker reads whole: a global input (ADR 0064).

Policy versions (ADR 0050) and freezes (ADR 0054) are events on ``events`` under their
own partition keys, so each lives in one partition. A consumer group hands that partition
to one decider worker, yet every worker decides with them. So each decider worker also
reads the control partitions whole, outside its group (as Kafka Streams reads a global
table): to their end before it decides anything, then whatever is new before each batch.
The events are handed to the decider in each partition's order; the decider ignores one
it has folded already (the worker owning the partition sees it twice).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
from callgate.adapters.kafka.client import client_config, partition_for, position
from callgate.adapters.kafka.connection import BrokerAddress
from callgate.domain.events import Event

log = logging.getLogger(__name__)


class GlobalInput:
    """The records of ``keys``' partitions of ``topic`` whose event type is in ``types``,
    read from the start by a consumer of its own (no group membership, no commits)."""

    def __init__(
        self,
        bootstrap: BrokerAddress,
        topic: str,
        *,
        keys: Collection[str],
        partitions: int,
        types: Collection[type[Event]],
        codec: AvroCodec,
    ) -> None:
        self._codec = codec
        self._types = tuple(types)
        self._partitions = sorted({partition_for(k.encode(), partitions) for k in keys})
        self._consumer = Consumer(
            client_config(
                bootstrap,
                **{
                    "group.id": "callgate.global-input",  # required; never joined/committed
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                    # What bounds a freeze's way to every worker: a fetch waits this long
                    # for new records at most.
                    "fetch.wait.max.ms": 50,
                },
            )
        )
        self._consumer.assign([TopicPartition(topic, p, 0) for p in self._partitions])

    def catch_up(self, timeout_s: float = 120.0) -> list[Event]:
        """Every control event up to each partition's end now (a worker's start: it decides
        nothing before it has folded them). Raises ``TimeoutError`` past ``timeout_s``."""
        pending = set(self._partitions)
        found: list[Event] = []
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"control partitions {sorted(pending)} never reached their end")
            found += self._take(self._consumer.consume(500, 0.1), pending)
        return found

    def poll(self) -> list[Event]:
        """The control events fetched since the last call; never waits."""
        return self._take(self._consumer.consume(500, 0), set())

    def close(self) -> None:
        self._consumer.close()

    def _take(self, msgs: Sequence[Message], pending: set[int]) -> list[Event]:
        found: list[Event] = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(position(msg)[1])
                else:  # transient (the client retries); the next poll goes on
                    log.warning("global input: %s", err)
                continue
            value = msg.value()
            if value is None or self._codec.event_class_of(value) not in self._types:
                continue
            try:
                found.append(self._codec.decode(value))
            except MalformedEvent:
                continue  # the runner owning the partition dead-letters it: none folds it
        return found
