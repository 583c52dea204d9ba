"""The one shape every runner executes: a process over per-partition-key state.

A *process* consumes events from its input topics and, for each event, returns the
new state of that event's partition key and the events that follow. Runners (the
embedded SQLite runner and the Kafka transactional runner) own everything else:
reading, batching, committing outputs + state + input positions atomically,
timers, and restoring state. One set of processes, two runners.

Deciders and projections are pure: ``handle`` and ``due`` do no I/O and read no
clock (``now_ms`` is passed in). The executor is the one process whose
``handle``/``follow_up`` talk to providers; it is the imperative shell around the
pure ``executor_core``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

from callgate.domain.canonical import canonical_json
from callgate.domain.events import Event

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class ViewRecord:
    """A keyed projection record (audit, pending, status views).

    Runners write it to the view's compacted Kafka topic (``callgate.view.<view>``) or the
    embedded view table; ``value_json is None`` is a tombstone (the key is removed).
    ``tenant`` is the tenant the record belongs to, when the projection knows it: on Kafka
    it travels as the ``cg-tenant`` header, so one tenant's UI filters without decoding
    (README "Views"). It is not part of the value.
    """

    view: str
    key: str
    value_json: str | None
    tenant: str | None = None

    @classmethod
    def of(
        cls, view: str, key: str, value: Mapping[str, Any] | None, tenant: str | None = None
    ) -> ViewRecord:
        return cls(view, key, None if value is None else canonical_json(value), tenant)

    @property
    def value(self) -> dict[str, Any] | None:
        if self.value_json is None:
            return None
        parsed: dict[str, Any] = json.loads(self.value_json)
        return parsed


# What a process may emit: events (routed by ``Event.TOPIC``) or view records.
Output = Event | ViewRecord


class Process(Protocol[S]):
    """A stateful stream process keyed by partition key."""

    @property
    def name(self) -> str:
        """Stable name: used for consumer groups, positions, state and changelogs."""
        ...

    @property
    def inputs(self) -> frozenset[str]:
        """Logical topic names consumed ("requests", "events")."""
        ...

    @property
    def recovers(self) -> bool:
        """True when ``recover`` must run for every stored key on taking ownership (executor)."""
        ...

    def initial_state(self) -> S: ...

    def handle(self, state: S, event: Event, now_ms: int) -> tuple[S, Sequence[Output]]:
        """React to one input event; return the key's new state and the events that follow."""
        ...

    def due(self, state: S, now_ms: int) -> tuple[S, Sequence[Output]]:
        """Fire timers that are due at ``now_ms`` (e.g. approval expiry)."""
        ...

    def next_due(self, state: S) -> int | None:
        """Earliest time a timer of this state is due, or None."""
        ...

    def follow_up(
        self, state: S, committed: Sequence[Event], now_ms: int
    ) -> tuple[S, Sequence[Output]]:
        """Work to do after ``committed`` outputs are durable (the executor calls providers).

        Runners call this after the commit that made ``committed`` durable and commit
        what it returns in a further transaction. Pure processes return ``(state, [])``.
        """
        ...

    def recover(self, state: S, now_ms: int) -> tuple[S, Sequence[Output]]:
        """Called once per key when a runner takes ownership (start-up, rebalance)."""
        ...

    def dump_state(self, state: S) -> bytes: ...

    def load_state(self, data: bytes) -> S: ...


def reacts_to(process: Process[Any]) -> frozenset[type[Event]] | None:
    """The event types whose ``handle`` may change the process's state or emit anything.

    A process may declare it as a ``reacts_to`` attribute; ``None`` (the default) means every
    type. Runners still consume, validate and commit every other event, but skip loading its
    key's state and calling ``handle`` (the decider ignores three of the five events of a
    call; docs/benchmarks.md). ``tests/unit/test_reacts_to.py`` checks each declaration
    against ``handle``.
    """
    return cast("frozenset[type[Event]] | None", getattr(process, "reacts_to", None))


def answered_by(process: Process[Any]) -> frozenset[type[Event]]:
    """The event types ``process`` answers: a process that appends one waits for the
    answer (the usage of a limit, ADR 0079). A process may declare them as an ``answers``
    attribute (none by default); the embedded runner takes the answer in the same round."""
    return cast("frozenset[type[Event]]", getattr(process, "answers", frozenset()))


@runtime_checkable
class ReadsControl(Protocol):
    """A process that folds control events beside its own inputs (ADR 0064): the runner
    seeds it with those before its position; on Kafka every worker of it reads their
    partitions (``control_keys``) whole."""

    control_events: tuple[type[Event], ...]
    control_keys: tuple[str, ...]

    def seed(self, events: Sequence[Event]) -> None: ...
