"""Kafka topic names, their specs, and idempotent creation with explicit configs.

Logical topics ("requests", "events", "dead-letter": ``Event.TOPIC``) map to physical names
under a configurable prefix: ``callgate.requests``. Views are compacted
``callgate.view.<view>`` topics; each process keeps its state in a compacted
``callgate.changelog.<process>``.

Co-partitioning (docs/contract.md "Shape"): requests, events, dead-letter and every changelog have
the
SAME partition count, and every producer uses the Java-compatible ``murmur2_random``
partitioner on the partition key, so every event of one invocation and every attempt with
one idempotency key land on one partition number, and the state of that key lives in the
same partition number of the changelog. ``ensure_topics`` refuses an existing topic whose
partition count differs: a silent mismatch would split keys across partitions.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

DEFAULT_PREFIX = "callgate"
DEFAULT_PARTITIONS = 6
LOGICAL_TOPICS = ("requests", "events", "dead-letter")
FOREVER = -1
DEAD_LETTER_RETENTION_MS = 90 * 24 * 3600 * 1000  # long enough for a person to look
# ``requests`` carry bearer session tokens: kept only as long as a request may wait to be
# consumed, never forever (replay needs only ``events``; ADR 0016). Setting
# ``requests_retention_ms``.
DEFAULT_REQUESTS_RETENTION_MS = 7 * 24 * 3600 * 1000
# The header naming the tenant a view record (or tombstone) belongs to, when known: one
# tenant's approval UI keeps only the records with its own (README "Views", ADR 0016).
HEADER_TENANT = "cg-tenant"


class NamedProcess(Protocol):
    """What the topic layout needs to know of a process (``domain.process_port.Process`` fits)."""

    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> frozenset[str]: ...


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One physical topic: how it is created and who writes and reads it (README table)."""

    name: str
    partitions: int
    cleanup_policy: str  # "delete" | "compact"
    retention_ms: int  # -1: forever
    key: str
    writers: tuple[str, ...]
    readers: tuple[str, ...]

    def config(self, replication_factor: int) -> dict[str, str]:
        """Explicit configs: a topic keeps callgate's retention, not the broker's defaults."""
        return {
            "cleanup.policy": self.cleanup_policy,
            "retention.ms": str(self.retention_ms),
            # Acks=all must survive one broker loss where there are replicas to lose.
            "min.insync.replicas": str(max(1, min(2, replication_factor - 1))),
        }


@dataclass(frozen=True, slots=True)
class Topics:
    """Physical names and group/transaction ids under one prefix."""

    prefix: str = DEFAULT_PREFIX
    partitions: int = DEFAULT_PARTITIONS
    requests_retention_ms: int = DEFAULT_REQUESTS_RETENTION_MS

    def physical(self, logical: str) -> str:
        if logical not in LOGICAL_TOPICS:
            raise ValueError(f"unknown logical topic {logical!r}; expected one of {LOGICAL_TOPICS}")
        return f"{self.prefix}.{logical}"

    def logical(self, physical: str) -> str | None:
        """The logical name of a physical input topic, or None if it is not one of ours."""
        head, _, tail = physical.partition(".")
        return tail if head == self.prefix and tail in LOGICAL_TOPICS else None

    def view(self, view: str) -> str:
        return f"{self.prefix}.view.{view}"

    def changelog(self, process: str) -> str:
        return f"{self.prefix}.changelog.{process}"

    def group(self, process: str) -> str:
        return f"{self.prefix}.{process}"

    def transactional_id(self, process: str, instance_id: str) -> str:
        """Stable per (process, instance): a restarted instance fences its previous self."""
        return f"{self.prefix}.{process}.{instance_id}"

    def specs(
        self, processes: Sequence[NamedProcess] = (), views: Mapping[str, str] | None = None
    ) -> list[TopicSpec]:
        """Every topic of a deployment. ``views`` maps view name -> the process writing it."""
        n = self.partitions

        def readers_of(logical: str) -> tuple[str, ...]:
            return tuple(sorted(p.name for p in processes if logical in p.inputs))

        specs = [
            TopicSpec(self.physical("requests"), n, "delete", self.requests_retention_ms,
                      "partition_key",
                      ("agent platforms", "approval UIs"), readers_of("requests")),
            TopicSpec(self.physical("events"), n, "delete", FOREVER, "partition_key",
                      ("callgate processes",), (*readers_of("events"), "compliance replay")),
            TopicSpec(self.physical("dead-letter"), n, "delete", DEAD_LETTER_RETENTION_MS,
                      "partition_key of the bad record", ("every runner",), ("operators",)),
        ]  # fmt: skip
        for view, writer in sorted((views or {}).items()):
            specs.append(
                TopicSpec(
                    name=self.view(view),
                    partitions=n,
                    cleanup_policy="compact",
                    retention_ms=FOREVER,
                    key="view key",
                    writers=(writer,),
                    readers=("approval UIs", "callgate CLI"),
                )
            )
        for process in sorted(processes, key=lambda p: p.name):
            specs.append(
                TopicSpec(
                    name=self.changelog(process.name),
                    partitions=n,
                    cleanup_policy="compact",
                    retention_ms=FOREVER,
                    key="partition_key",
                    writers=(process.name,),
                    readers=(f"{process.name} (restore)",),
                )
            )
        return specs


def topic_table_markdown(specs: Iterable[TopicSpec]) -> str:
    """The README "Topics" table."""
    rows = [
        "| topic | partitions | cleanup | retention | key | written by | read by |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in specs:
        retention = "forever" if s.retention_ms < 0 else f"{s.retention_ms // 86_400_000} days"
        rows.append(
            f"| `{s.name}` | {s.partitions} | {s.cleanup_policy} | {retention} | {s.key} "
            f"| {', '.join(s.writers) or '-'} | {', '.join(s.readers) or '-'} |"
        )
    return "\n".join(rows) + "\n"


DEFAULT_REPLICAS = 3


def replication_for(admin: AdminClient, timeout_s: float = 30.0) -> int:
    """The replication factor of new topics when none is set: three, or every broker of a
    smaller cluster (a single development broker gets one)."""
    brokers = len(admin.list_topics(timeout=timeout_s).brokers)
    return max(1, min(DEFAULT_REPLICAS, brokers))


class TopicMismatch(RuntimeError):
    """An existing topic has another partition count: co-partitioning would break."""


def ensure_topics(
    admin: AdminClient,
    specs: Sequence[TopicSpec],
    replication_factor: int = 1,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create missing topics with explicit configs; returns the names created.

    Existing topics are checked for their partition count (``TopicMismatch``) and left
    alone otherwise: configs of live topics are an operator's decision.
    """
    new = [
        NewTopic(s.name, s.partitions, replication_factor, config=s.config(replication_factor))
        for s in specs
    ]
    created: list[str] = []
    if new:
        for name, future in admin.create_topics(new, request_timeout=timeout_s).items():
            try:
                future.result(timeout=timeout_s)
                created.append(name)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
    deadline = time.monotonic() + timeout_s
    while True:  # new topics may take a moment to show in metadata
        metadata = admin.list_topics(timeout=timeout_s)
        have = {s.name: len(t.partitions) for s in specs if (t := metadata.topics.get(s.name))}
        wrong = [s for s in specs if have.get(s.name, 0) != s.partitions]
        if not wrong:
            return created
        if time.monotonic() > deadline or any(s.name in have for s in wrong):
            s = wrong[0]
            got = have.get(s.name, 0)
            raise TopicMismatch(f"{s.name} has {got} partitions, expected {s.partitions}")
        time.sleep(0.1)
