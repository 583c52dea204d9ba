"""Follow-on events of the decider, with deterministic envelopes.

Event ids derive from the causing event and the position in its output, so replaying
the log yields byte-identical events (pure core: no random ids, no clock).
"""

from __future__ import annotations

from typing import Any

from callgate.domain import events as ev
from callgate.domain.canonical import derive_id
from callgate.domain.process_port import Output

PRODUCER = "decider"


class Emitter:
    """Builds follow-on events with envelopes derived from the causing event."""

    def __init__(self, cause: ev.Event, now_ms: int) -> None:
        self.cause = cause
        self.now_ms = now_ms
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
        self.out.append(
            cls(
                event_id=derive_id(self.cause.event_id, str(len(self.out)), cls.__name__),
                invocation_id=inv,
                partition_key=self.cause.partition_key if partition_key is None else partition_key,
                causation_id=self.cause.event_id,
                correlation_id=self.cause.correlation_id or self.cause.invocation_id,
                occurred_at=self.now_ms,
                producer=PRODUCER,
                **fields,
            )
        )


def tick_event(invocation_id: str, what: str, now_ms: int) -> ev.Event:
    """A synthetic cause for timer-fired events, so their ids stay deterministic."""
    return ev.Event(
        event_id=derive_id("timer", invocation_id, what),
        invocation_id=invocation_id,
        partition_key="",
        occurred_at=now_ms,
    )


__all__ = ["PRODUCER", "Emitter", "tick_event"]
