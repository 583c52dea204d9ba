"""The transaction a Kafka runner is filling, and its commit (steps 4-7 of the runner's
commit sequence, ``kafka.runner``).

A ``Checkpoint`` owns the runner's transactional producer. The first record produced
begins a transaction, named by a token (``HEADER_TXN`` on each record, and in the state
stores it commits); ``commit`` adds the input offsets and the changelog bounds to it with
the consumer group's metadata (KIP-447 zombie fencing) and commits. After a failure,
``abort`` gives the producer up: the next ``ready`` makes a new one of the same
``transactional.id``, whose ``init_transactions`` fences the old.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from callgate.adapters.kafka.client import make_consumer, make_producer, position
from callgate.adapters.kafka.connection import BrokerAddress
from callgate.adapters.kafka.state import HEADER_PREV, HEADER_TXN
from callgate.adapters.kafka.topics import Topics
from callgate.adapters.kafka.watchdog import CALL_TIMEOUT_S, Watchdog

TRANSACTION_TIMEOUT_MS = 15_000
# Latency settings: a caller waits on every hop of the critical path (docs/benchmarks.md,
# "Latency settings"). The producer sends what ``handle`` produces within a millisecond,
# so the transaction's records are mostly on the broker when the commit sequence flushes
# (flush itself never waits for linger); Nagle's algorithm is off on every socket, so a
# small request never waits for the ack of the one before it.
PRODUCER_LATENCY: dict[str, Any] = {"linger.ms": 1, "socket.nagle.disable": True}
# A transaction's first request waits until this long after the previous commit returned
# (docs/adr/0020-transaction-gap.md). Apache Kafka answers ``AddPartitionsToTxn`` (and
# ``AddOffsetsToTxn``) with CONCURRENT_TRANSACTIONS while it still writes the previous
# transaction's commit markers, about 1-2 ms on loopback, and librdkafka retries that after
# a fixed 20 ms: a transaction begun right after a commit (the executor's follow-up after
# ``ExecutionStarted``, any runner with records waiting) took 30 ms instead of 5-8. The
# worker (``callgate serve``) passes it by default; ``KafkaRunner`` itself defaults to 0.
TRANSACTION_GAP_MS = 3
_FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


class ProducerFenced(RuntimeError):
    """Another instance took over this runner's ``transactional.id``: stop, do not continue."""


class Checkpoint:
    """One runner's transactional producer and the transaction it has open, if any.

    ``group`` is the runner's consumer (its group metadata fences zombies); ``no_member``
    a consumer of the same group never subscribed (``init``); ``placeholder`` a topic of
    the group's inputs; ``gap_s``: ``TRANSACTION_GAP_MS``; ``watchdog`` bounds each
    blocking client call."""

    def __init__(
        self,
        new_producer: Callable[[], Producer],
        group: Consumer,
        no_member: Consumer,
        placeholder: str,
        token_prefix: str,
        gap_s: float = 0.0,
        watchdog: Watchdog | None = None,
    ) -> None:
        self._new_producer = new_producer
        self.producer = new_producer()
        self._group = group
        self.no_member = no_member
        self._placeholder = placeholder
        self._token_prefix = token_prefix
        self._token_seq = 0
        self._gap_s = gap_s
        self._watchdog = watchdog
        self._committed_at = 0.0  # time.monotonic() when the last commit returned
        self._needs_init = False  # a replaced producer waits for its init_transactions
        self.token: str | None = None  # the open transaction's; None: none open
        self.transactions = 0  # committed: the broker's work scales with it

    def bounded(self, step: str) -> contextlib.AbstractContextManager[None]:
        """The watchdog's bound around one blocking client call."""
        if self._watchdog is None:
            return contextlib.nullcontext()
        return self._watchdog.bounded(step)

    def ready(self) -> None:
        """Make and initialize the producer that replaces one given up (``abort``); made
        now, not at the failure: one made while the broker was away learned nothing of it
        yet (a fresh client per attempt until one initializes)."""
        if self._needs_init:
            self.producer = self._new_producer()
            self.init()
            self._needs_init = False

    def init(self) -> None:
        """``init_transactions``, then a transaction that holds only offsets of the
        group and is aborted at once.

        ``init_transactions`` fences the earlier producers of this ``transactional.id`` and
        has the coordinator abort their open transaction. After a broker restart the group
        coordinator can still hold transactional offsets of this producer id as pending
        with no transaction left to end them: a request of an earlier producer retried after
        its transaction was aborted. Every ``read_committed`` reader of the group then waits
        on them (KIP-447: the committed positions are unstable) until this producer id ends
        a transaction that includes the group; the abort does that, applying none of them.
        Its offsets are never applied either. It commits under the group with no member
        (no generation): the group coordinator checks no membership then, and the
        runner's own member may be one the coordinator has forgotten with the broker
        restart, until its next poll joins again."""
        with self.bounded("init_transactions"):
            self.producer.init_transactions(CALL_TIMEOUT_S)
        self.producer.begin_transaction()
        placeholder = [TopicPartition(self._placeholder, 0, 0)]
        with self.bounded("send_offsets_to_transaction"):
            self.producer.send_offsets_to_transaction(
                placeholder, self.no_member.consumer_group_metadata(), CALL_TIMEOUT_S
            )
        with self.bounded("abort_transaction"):
            self.producer.abort_transaction(CALL_TIMEOUT_S)

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int = -1,
        headers: Sequence[tuple[str, bytes]] = (),
        on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
    ) -> None:
        """Produce one record into the open transaction (begun by the first)."""
        token = self.token if self.token is not None else self._begin()
        kwargs: dict[str, Any] = {"key": key, "value": value, "partition": partition}
        kwargs["headers"] = [(HEADER_TXN, token.encode()), *headers]
        if on_delivery is not None:
            kwargs["on_delivery"] = on_delivery
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:  # local queue full: let deliveries drain
                self.producer.poll(0.1)

    def produce_changelog(
        self, changelog: str, blobs: Mapping[int, Mapping[str, bytes]], heads: Mapping[int, str]
    ) -> dict[int, int]:
        """Step 4: produce each changed state (``blobs``: partition -> key -> bytes) to its
        partition of ``changelog``, each record naming the partition's last committed token
        (``heads``; ``state.HEADER_PREV``), and flush; returns the changelog bounds (one past
        each partition's last record). Raises the first delivery error."""
        bounds: dict[int, int] = {}
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                _, partition, offset = position(msg)
                bounds[partition] = max(bounds.get(partition, 0), offset + 1)

        for partition, changed in blobs.items():
            prev = [(HEADER_PREV, heads[partition].encode())]
            for key, blob in changed.items():
                self.produce(changelog, key.encode(), blob, partition, prev, delivered)
        self.flush()
        if errors:
            raise KafkaException(errors[0])
        return bounds

    def flush(self) -> None:
        """Wait until every record of the open transaction is acknowledged (the delivery
        callbacks have run), or raise."""
        if self.token is None:
            return
        with self.bounded("flush"):
            unsent = self.producer.flush(CALL_TIMEOUT_S)
        if unsent > 0:
            raise TimeoutError(f"transaction records not acknowledged in {CALL_TIMEOUT_S}s")

    def commit(self, offsets: Sequence[TopicPartition]) -> str:
        """Add ``offsets`` to the transaction (begun for them when none is open) and commit
        it; returns its token."""
        if offsets:
            if self.token is None:
                self._begin()
            with self.bounded("send_offsets_to_transaction"):
                self.producer.send_offsets_to_transaction(
                    list(offsets), self._group.consumer_group_metadata(), CALL_TIMEOUT_S
                )
        self._commit_transaction()
        token, self.token = self.token or "", None
        self.transactions += 1
        self._committed_at = time.monotonic()
        return token

    def abort(self) -> None:
        """Abort the open transaction and give up the producer (``ready`` replaces it).

        The old producer is not trusted again: its abort may have timed out with the broker
        away, it may be unusable (INVALID_TXN_STATE when an abort races the registration of
        a transaction just begun, confluentinc/librdkafka#4849), and after a broker restart
        it may keep a group coordinator that is gone, waiting on it forever
        (confluentinc/librdkafka#5511). Raises ``ProducerFenced`` when fenced: never
        replaced then, or the replacement would fence the instance that fenced this one."""
        self.token = None
        try:
            with self.bounded("abort_transaction"):
                self.producer.abort_transaction(CALL_TIMEOUT_S)
        except KafkaException as abort_exc:
            err = kafka_error(abort_exc)
            if err is not None and err.code() in _FENCED_CODES:
                raise ProducerFenced(str(err)) from abort_exc  # a fenced runner must exit
        self._needs_init = True

    def _begin(self) -> str:
        """Begin a transaction, no sooner than ``gap_s`` after the last commit (its first
        request would meet CONCURRENT_TRANSACTIONS: ``TRANSACTION_GAP_MS``)."""
        wait = self._committed_at + self._gap_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self.producer.begin_transaction()
        self._token_seq += 1
        self.token = f"{self._token_prefix}.{self._token_seq}"
        return self.token

    def _commit_transaction(self) -> None:
        """Commit, asking again while the error is retriable (the outcome is not known
        yet: librdkafka continues the commit it began); anything else raises."""
        for _ in range(5):
            try:
                with self.bounded("commit_transaction"):
                    self.producer.commit_transaction(CALL_TIMEOUT_S)
                return
            except KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
        with self.bounded("commit_transaction"):
            self.producer.commit_transaction(CALL_TIMEOUT_S)


def kafka_error(exc: BaseException) -> KafkaError | None:
    if not isinstance(exc, KafkaException) or not exc.args:
        return None
    err = exc.args[0]
    return err if isinstance(err, KafkaError) else None


def raise_if_fatal(exc: BaseException) -> None:
    """Raise ``ProducerFenced`` when fenced, the error itself when it is fatal."""
    err = kafka_error(exc)
    if err is None:
        return
    if err.code() in _FENCED_CODES:
        raise ProducerFenced(str(err)) from exc
    if err.fatal():
        raise exc


def process_checkpoint(
    bootstrap: BrokerAddress,
    topics: Topics,
    process: str,
    instance_id: str,
    group: Consumer,
    placeholder: str,
    gap_s: float = 0.0,
    watchdog: Watchdog | None = None,
) -> Checkpoint:
    """The checkpoint of ``process``'s runner ``instance_id``: its producers are of the
    ``transactional.id`` the instance fixes; ``group`` is the runner's subscribed consumer,
    ``placeholder`` one of its input topics (``Checkpoint.init``). Its tokens are unique to
    this incarnation (the instance id and a random suffix)."""

    def new_producer() -> Producer:
        return make_producer(
            bootstrap,
            topics.transactional_id(process, instance_id),
            **{**PRODUCER_LATENCY, "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS},
        )

    # Never subscribed: the group's metadata with no member and no generation, which the
    # placeholder transaction of a new producer commits under (``Checkpoint.init``).
    no_member = make_consumer(bootstrap, topics.group(process))
    return Checkpoint(
        new_producer, group, no_member, placeholder,
        f"{instance_id}.{uuid.uuid4().hex[:12]}", gap_s, watchdog,
    )  # fmt: skip
