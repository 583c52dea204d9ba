"""Follow-on events of the decider, with deterministic envelopes, folded as they are emitted.

Event ids derive from the causing event and the position in its output, so replaying
the log yields byte-identical events (pure core: no random ids, no clock). Each emitted
event is folded into ``state`` by ``evolve`` at once (ADR 0092): the rules only read state
and emit, and one that reads after emitting sees what its event changed.
"""

from __future__ import annotations

from typing import Any

from callgate.decider.evolve import evolve
from callgate.decider.state import DeciderState
from callgate.domain import events as ev
from callgate.domain.canonical import derive_id
from callgate.domain.process_port import Output

PRODUCER = "decider"


class Emitter:
    """Builds follow-on events with envelopes derived from the causing event, and keeps the
    state they lead to: ``before`` the cause, ``state`` after the cause (folded unless
    given) and every event emitted so far."""

    def __init__(
        self,
        cause: ev.Event,
        now_ms: int,
        before: DeciderState,
        state: DeciderState | None = None,
    ) -> None:
        self.cause = cause
        self.now_ms = now_ms
        # What the rules compare with to tell a redelivered input from a first one.
        self.before = before
        self.state = evolve(before, cause) if state is None else state
        self.out: list[Output] = []

    def emit(
        self,
        cls: type[ev.Event],
        invocation_id: str | None = None,
        partition_key: str | None = None,
        **fields: Any,
    ) -> None:
        """``partition_key``: another key than the cause's (a limit's scope, ADR 0079)."""
        inv = invocation_id or self.cause.invocation_id
        event = cls(
            event_id=derive_id(self.cause.event_id, str(len(self.out)), cls.__name__),
            invocation_id=inv,
            partition_key=self.cause.partition_key if partition_key is None else partition_key,
            causation_id=self.cause.event_id,
            correlation_id=self.cause.correlation_id or self.cause.invocation_id,
            occurred_at=self.now_ms,
            producer=PRODUCER,
            **fields,
        )
        self.out.append(event)
        self.state = evolve(self.state, event)


def tick_event(invocation_id: str, what: str, now_ms: int) -> ev.Event:
    """A synthetic cause for timer-fired events, so their ids stay deterministic."""
    return ev.Event(
        event_id=derive_id("timer", invocation_id, what),
        invocation_id=invocation_id,
        partition_key="",
        occurred_at=now_ms,
    )


__all__ = ["PRODUCER", "Emitter", "tick_event"]
