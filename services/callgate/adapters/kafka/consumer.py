"""The consumer of a Kafka runner's inputs: its place in the group and the batches it reads.

Kept apart from the runner's commit sequence because none of it writes: it joins the group,
notes what an assignment hands over (the runner takes it up between batches, never inside a
librdkafka callback), says when a join is overdue, and reads one batch at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from callgate.adapters.kafka.client import make_consumer
from callgate.adapters.kafka.connection import BrokerAddress

log = logging.getLogger(__name__)

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


class InputConsumer:
    """A runner's group member over its input topics (``inputs``, physical names).

    ``on_revoke`` is called when partitions are taken away (only inside ``consume``, where no
    transaction is open). ``batch_size``, ``batch_timeout_s`` and ``linger_s``: see
    ``consume``.
    """

    def __init__(
        self,
        bootstrap: BrokerAddress,
        group: str,
        client_id: str,
        inputs: Sequence[str],
        overrides: Mapping[str, Any] | None,
        on_revoke: Callable[[], None],
        batch: tuple[int, float, float],
        join_overdue_s: float = JOIN_OVERDUE_S,
    ) -> None:
        # Dynamic membership (ADR 0015): a lost instance's partitions move to the others
        # once it misses ``session.timeout.ms``; a stopping one leaves the group at once.
        # ``client.id`` names the instance in the group's member list.
        settings: dict[str, Any] = {**GROUP_SETTINGS, "client.id": client_id}
        settings.update(CONSUMER_LATENCY)
        settings.update(overrides or {})
        self.consumer: Consumer = make_consumer(bootstrap, group, **settings)
        self.group = group
        self._inputs = list(inputs)
        self._on_revoked = on_revoke
        self._batch_size, self._batch_timeout_s, self._linger_s = batch
        self._join_overdue_s = join_overdue_s
        self._pending: list[int] | None = None
        self._joining_since: float | None = None  # time.monotonic(); None once assigned

    def subscribe(self) -> None:
        self.consumer.subscribe(
            self._inputs,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        self._joining_since = time.monotonic()

    def take_assignment(self) -> list[int] | None:
        """The partition numbers assigned since the last call, if the group assigned any."""
        pending, self._pending = self._pending, None
        return pending

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Restored after consume() returns, before any record of the batch is handled.
        self._pending = sorted({tp.partition for tp in partitions})
        self._joining_since = None

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Called only inside consume(), where no transaction is open.
        self._pending = None
        self._on_revoked()
        self._joining_since = time.monotonic()

    def warn_if_join_overdue(self, process: str) -> None:
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
            process, waited, self.group,
        )  # fmt: skip

    def consume(self, due: int | None, clock: Callable[[], int]) -> list[Message]:
        """Wait up to ``batch_timeout_s`` for the first record (less when a timer is ``due``
        sooner, ms), then take what is already fetched up to ``batch_size`` (under load
        records queue up while a commit runs); with ``linger_s``, keep collecting that long
        after the first record (a process no caller waits on, such as the audit projection:
        fewer, larger transactions)."""
        timeout = self._batch_timeout_s
        if due is not None:
            timeout = max(0.0, min(timeout, (due - clock()) / 1000))
        msgs: list[Message] = self.consumer.consume(1, timeout)
        if msgs and self._batch_size > 1:
            linger = self._linger_s
            if linger and due is not None:  # a timer due sooner is not held back
                linger = max(0.0, min(linger, (due - clock()) / 1000))
            # Returns when the batch is full or ``linger`` has passed.
            msgs += self.consumer.consume(self._batch_size - 1, linger)
        return msgs


def is_record(msg: Message, process: str) -> bool:
    """Whether ``msg`` is a record rather than an error: a fatal error raises, a partition's
    end is passed over and any other error is logged (the client retries it)."""
    err = msg.error()
    if err is None:
        return True
    if err.fatal():
        raise KafkaException(err)
    if err.code() != KafkaError._PARTITION_EOF:
        log.warning("%s: consumer error %s", process, err)
    return False
