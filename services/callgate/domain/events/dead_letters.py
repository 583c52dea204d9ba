"""The ``dead-letter`` topic's one event: input no reader could decode or validate."""

from __future__ import annotations

from typing import ClassVar

from callgate.domain.events.envelope import Event, event_class


@event_class
class EventDeadLettered(Event):
    """Input that could not be decoded or validated, kept with its reason and original bytes."""

    TOPIC: ClassVar[str] = "dead-letter"
    code: str
    reason: str
    source_topic: str
    source_partition: int
    source_offset: int
    original: bytes
