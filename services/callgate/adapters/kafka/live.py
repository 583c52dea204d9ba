"""The HTTP server's read model on Kafka: the view topics tailed into memory, continuously.

``KafkaBackend`` (the SDK's) catches up on every read; a server answering many requests
must not. ``LiveKafkaBackend`` runs one consumer thread, assigned to every partition of
every view topic and of the dead-letter topic from the beginning, that applies records
to in-memory tables as they arrive (a tombstone removes a key) and wakes the waiters.
Requests read the tables under a lock and never touch the broker. Until the first
catch-up has reached the end of every partition (``enable.partition.eof``: the high
watermark of a transactional topic counts commit markers no consumer is given) the server
reports not ready.

``KafkaStats`` gives /metrics the consumer lag of each process's group (committed offset
against the high watermark, commit markers included) and the dead-letter count.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from callgate.adapters.following import follow_view
from callgate.adapters.kafka.backend import KafkaBackend, _obj
from callgate.adapters.kafka.client import client_config, fetched, make_admin, position
from callgate.domain.events import Event
from callgate.domain.process_port import Process
from callgate.settings import Settings

if TYPE_CHECKING:
    from callgate.tracing import Tracing

log = logging.getLogger("callgate.http")


class LiveKafkaBackend(KafkaBackend):
    def __init__(
        self,
        settings: Settings,
        projections: Sequence[Process[Any]],
        tracing: Tracing | None = None,
    ) -> None:
        super().__init__(settings, projections, tracing)
        self._views: dict[str, dict[str, str]] = {v: {} for v in self._writers}
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self.dead_letters = 0
        self.failure: str | None = None
        self._dead_topic = self.topics.physical("dead-letter")
        self._thread = threading.Thread(target=self._tail, name="callgate-view-tail", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def caught_up(self) -> bool:
        return self._caught_up.is_set()

    def _tail(self) -> None:
        try:
            consumer = Consumer(
                client_config(
                    self.bootstrap,
                    **{
                        "group.id": f"{self.topics.prefix}.http-views",  # assigned, never joined
                        "enable.auto.commit": False,
                        "enable.partition.eof": True,
                        "isolation.level": "read_committed",
                        # A parked read_committed fetch is answered when new bytes come,
                        # not when a commit makes records visible (``gateway``): the tail
                        # asks again at most this long after a view's commit.
                        "fetch.wait.max.ms": 10,
                    },
                )
            )
            assignment: list[TopicPartition] = []
            deadline = time.monotonic() + 120
            while not assignment and not self._stop.is_set():
                meta = consumer.list_topics(timeout=10)
                wanted = [*self._by_topic, self._dead_topic]
                infos = [meta.topics.get(t) for t in wanted]
                if all(i is not None and i.error is None and i.partitions for i in infos):
                    for topic, info in zip(wanted, infos, strict=True):
                        assert info is not None
                        assignment += [TopicPartition(topic, p, 0) for p in sorted(info.partitions)]
                elif time.monotonic() > deadline:
                    raise RuntimeError("the view topics do not exist")
                else:
                    self._stop.wait(0.5)
            consumer.assign(assignment)
            pending = {(tp.topic, tp.partition) for tp in assignment}
            try:
                while not self._stop.is_set():
                    # what has arrived, at once: consume(1000, t) held every answer for
                    # the whole t when fewer than 1000 records came (100 ms a call)
                    ended = self._apply(fetched(consumer, 0.1))
                    if pending:
                        pending -= ended
                        if not pending:
                            self._caught_up.set()
            finally:
                consumer.close()
        except Exception as exc:  # the server reports it on /readyz and stops serving reads
            self.failure = f"{type(exc).__name__}: {exc}"
            log.exception("the view tail stopped")
            with self._changed:
                self._changed.notify_all()

    def _apply(self, msgs: Sequence[Any]) -> set[tuple[str, int]]:
        ended: set[tuple[str, int]] = set()
        if not msgs:
            return ended
        with self._changed:
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        ended.add(position(msg)[:2])
                        continue
                    raise KafkaException(err)
                topic = position(msg)[0]
                if topic == self._dead_topic:
                    self.dead_letters += 1
                    continue
                view = self._by_topic[topic]
                key = (msg.key() or b"").decode()
                value = msg.value()
                if value is None:
                    self._views[view].pop(key, None)
                else:
                    self._views[view][key] = self._decode(value)
            self._changed.notify_all()
        return ended

    def _decode(self, value: bytes) -> str:
        """A view record's value (Avro, the published view schemas) as the canonical JSON
        text the projections emitted (``ViewCodec.decode_json``)."""
        return self.views.decode_json(value)[1]

    # -- the Backend protocol, from memory -------------------------------------------------

    def view(self, view: str, key: str) -> dict[str, Any] | None:
        with self._changed:
            raw = self._views.get(view, {}).get(key)
        return None if raw is None else _obj(raw)

    def view_items_raw(self, view: str) -> list[tuple[str, str]]:
        with self._changed:
            items = list(self._views.get(view, {}).items())
        return sorted(items)

    def follow(
        self,
        request: Event,
        view: str,
        key: str,
        done: Callable[[dict[str, Any]], bool],
        timeout_s: float,
    ) -> dict[str, Any] | None:
        """Publish ``request``; the value ``view`` holds at ``key`` once ``done`` (the last
        one seen at the timeout, ``None`` if none), from the in-memory table."""
        return follow_view(self, request, view, key, done, timeout_s)

    def partition_key_of(self, invocation_id: str) -> str | None:
        """The partition key of a known invocation, from the pending or the status view."""
        record = self.view("pending", invocation_id) or self.view("status", invocation_id)
        return None if record is None else str(record["partition_key"])

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.failure is not None:
                return False
            with self._changed:
                self._changed.wait(min(remaining, 0.5))
        return True

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._producer.flush(10)


class KafkaStats:
    """Lag, dead letters and readiness of a Kafka deployment, for the HTTP server."""

    CACHE_S = 5.0

    def __init__(
        self,
        backend: LiveKafkaBackend,
        processes: Sequence[Process[Any]],
        children_alive: Callable[[], str | None],
        stalls: Callable[[], dict[str, int]] = dict,
    ) -> None:
        self._backend = backend
        self._processes = list(processes)
        self._children_alive = children_alive
        self._stalls = stalls
        self._admin = make_admin(backend.bootstrap)
        self._lock = threading.Lock()
        self._lag: dict[str, int] = {}
        self._lag_at = 0.0
        self._watermarks: Consumer | None = None

    def decisions(self) -> dict[tuple[str, str], int]:
        counts: Counter[tuple[str, str]] = Counter(
            (str(v.get("outcome")), str(v.get("tool") or ""))
            for _, v in self._backend.view_items("status")
        )
        return dict(counts)

    def dead_letters(self) -> int:
        return self._backend.dead_letters

    def stalls(self) -> dict[str, int]:
        return dict(self._stalls())

    def shadow_differed(self) -> int | None:
        return None  # not tallied on Kafka yet: ``callgate policy shadow report`` reads them

    def not_ready(self) -> str | None:
        if self._backend.failure is not None:
            return f"view tail failed: {self._backend.failure}"
        if not self._backend.caught_up:
            return "reading the view topics"
        return self._children_alive()

    def consumer_lag(self) -> dict[str, int]:
        with self._lock:
            if time.monotonic() - self._lag_at > self.CACHE_S:
                self._lag = self._measure()
                self._lag_at = time.monotonic()
            return dict(self._lag)

    def _measure(self) -> dict[str, int]:
        from confluent_kafka import ConsumerGroupTopicPartitions

        if self._watermarks is None:
            self._watermarks = Consumer(
                client_config(self._backend.bootstrap, **{"group.id": "callgate-lag-probe"})
            )
        topics = self._backend.topics
        parts = range(topics.partitions)
        lag: dict[str, int] = {}
        for process in self._processes:
            inputs = [topics.physical(t) for t in sorted(process.inputs)]
            tps = [TopicPartition(t, p) for t in inputs for p in parts]
            request = [ConsumerGroupTopicPartitions(topics.group(process.name), tps)]
            try:
                result = self._admin.list_consumer_group_offsets(request)
                committed = next(iter(result.values())).result(timeout=5)
                total = 0
                for tp in committed.topic_partitions or []:
                    _, high = self._watermarks.get_watermark_offsets(
                        TopicPartition(tp.topic, tp.partition), timeout=5, cached=False
                    )
                    total += max(0, high - max(tp.offset, 0))
                lag[process.name] = total
            except KafkaException:
                log.warning("consumer lag of %s not measured", process.name, exc_info=True)
        return lag
