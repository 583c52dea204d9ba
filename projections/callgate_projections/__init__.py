"""Projections: pure folds of the ``events`` topic into keyed views (docs/contract.md "Shape").

Three projections, one module each: ``status`` (invocation status), ``pending`` (the
pending-approval view an approval UI consumes, C5) and ``audit`` (the hash-chained audit
trail, C9).

The shape, chosen so that one runner drives deciders and projections on both backends:

- The pure core of each projection is ``project(state, event) -> (state, records)``. It
  takes no ``now_ms``: a view that read the clock could not be rebuilt byte for byte by
  replaying the log, so every time in a record comes from ``event.occurred_at``.
- A projection emits ``ViewRecord`` s, not events: a record is the latest value of one key
  of one view (``value_json=None`` is a tombstone). On Kafka a view is a keyed, compacted
  topic; on the embedded backend a row of the ``views`` table (``StoreTx.put_view``).
- ``Projection`` (below) implements ``callgate.domain.process_port.Process``: ``handle`` is
  ``project`` (ignoring ``now_ms``) and its outputs are ``ViewRecord`` s; timers, ``follow_up`` and
  ``recover`` do nothing. A runner commits the records, the key's state and the input
  position together, exactly as it commits a decider's events.
- State is per partition key, like a decider's; ``dump_state`` is canonical JSON, so equal
  states are equal bytes, and ``fold_log`` replays a log from scratch for ``callgate replay``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from callgate.domain.codes import Code, Rejection
from callgate.domain.events import EVENT_TYPES, Event
from callgate.domain.process_port import ViewRecord

__all__ = [
    "EVENTS_TOPIC",
    "LOG_EVENTS",
    "USAGE_EVENTS",
    "Projection",
    "ViewRecord",
    "fold_log",
    "keeps_states_immutable",
    "load_json_object",
    "materialize",
    "parse_json_field",
]

S = TypeVar("S")

# What a projection consumes: the authoritative invocation log.
EVENTS_TOPIC = "events"
# The event classes written to it.
LOG_EVENTS: frozenset[type[Event]] = frozenset(c for c in EVENT_TYPES if c.TOPIC == EVENTS_TOPIC)
# The usage limits' own events (ADR 0079): what became of a call is told by the call's own
# events, so the views of calls (status, audit) take none of them.
USAGE_EVENTS: frozenset[type[Event]] = frozenset(
    c for c in LOG_EVENTS if c.__name__.startswith("Usage")
)


def parse_json_field(text: str, field: str) -> Any:
    """Parse a JSON payload field of an event; empty means absent (``None``).

    These fields are written by callgate services as canonical JSON, so a parse failure
    is a corrupt log: fail closed with ``malformed_event`` rather than project a guess.
    """
    if text == "":
        return None
    try:
        return _FIELD_DECODER.decode(text)
    except ValueError as exc:
        raise Rejection(Code.MALFORMED_EVENT, f"{field} is not JSON", {"field": field}) from exc


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Built once: ``json.loads`` with any keyword builds a new decoder per call, which was about
# 4% of the embedded runner's time (docs/explanation/benchmarks.md).
_FIELD_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def load_json_object(data: bytes) -> dict[str, Any]:
    """Decode a dumped state (``dump_state`` output)."""
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("projection state must be a JSON object")
    return value


class Projection(ABC, Generic[S]):
    """A ``Process``-shaped projection: per-partition-key state, ``ViewRecord`` outputs."""

    name: ClassVar[str]
    views: ClassVar[frozenset[str]]
    inputs: ClassVar[frozenset[str]] = frozenset({EVENTS_TOPIC})
    recovers: ClassVar[bool] = False
    # The event classes ``project`` may react to; ``None``: any. For every other class
    # ``project`` returns the very same state and no records (and never raises), so a
    # replay may skip the call (tests/unit/test_replay_fast.py checks it per projection).
    reacts_to: ClassVar[frozenset[type[Event]] | None] = None

    @abstractmethod
    def initial_state(self) -> S: ...

    @abstractmethod
    def project(self, state: S, event: Event) -> tuple[S, Sequence[ViewRecord]]:
        """The pure fold step: the key's new state and the view records that changed."""

    @abstractmethod
    def dump_state(self, state: S) -> bytes: ...

    @abstractmethod
    def load_state(self, data: bytes) -> S: ...

    def handle(self, state: S, event: Event, now_ms: int) -> tuple[S, Sequence[ViewRecord]]:
        """``Process.handle`` with view records as outputs; ``now_ms`` is deliberately unused."""
        return self.project(state, event)

    def due(self, state: S, now_ms: int) -> tuple[S, Sequence[ViewRecord]]:
        return state, ()

    def next_due(self, state: S) -> int | None:
        return None

    def follow_up(
        self, state: S, committed: Sequence[Event], now_ms: int
    ) -> tuple[S, Sequence[ViewRecord]]:
        return state, ()

    def recover(self, state: S, now_ms: int) -> tuple[S, Sequence[ViewRecord]]:
        return state, ()


def fold_log(
    projection: Projection[S], events: Iterable[Event], states: Mapping[str, S] | None = None
) -> tuple[dict[str, S], list[ViewRecord]]:
    """Fold ``events`` (in log order) per partition key, as a runner would.

    Starting from no ``states`` this rebuilds a projection from the start of the log
    (``callgate replay``); the result is a pure function of the events.
    """
    current: dict[str, S] = dict(states or {})
    records: list[ViewRecord] = []
    for event in events:
        key = event.partition_key
        state = current[key] if key in current else projection.initial_state()
        current[key], out = projection.project(state, event)
        records.extend(out)
    return current, records


def materialize(records: Iterable[ViewRecord], view: str) -> dict[str, dict[str, Any]]:
    """The contents of ``view`` after ``records``: last value per key wins, tombstones delete.

    This is what a compacted topic or the embedded ``views`` table holds.
    """
    table: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.view != view:
            continue
        value = record.value
        if value is None:
            table.pop(record.key, None)
        else:
            table[record.key] = value
    return table


def keeps_states_immutable(process: object) -> bool:
    """Whether ``process`` never changes a state object in place, so that a ``handle`` /
    ``follow_up`` / ``due`` / ``recover`` returning the object it was given means "no
    change" and a runner need not dump the state to compare it. True for projections
    (frozen dataclasses, ``MappingProxyType``, frozensets; tested in
    ``tests/unit/test_state_identity.py``); the decider and the executor update their state
    in place, so their states are always dumped and compared."""
    return isinstance(process, Projection)
