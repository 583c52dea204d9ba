"""Pinned upstream tools on the ``events`` topic (ADR 0066): a tool's definition pinned, and
a change of it seen.
"""

from __future__ import annotations

from callgate.domain.events.envelope import Event, event_class


@event_class
class ToolPinned(Event):
    """An operator pinned catalog ``tool`` to the upstream definition with ``digest``."""

    tool: str
    digest: str
    reason: str
    author: str
    tenant: str


@event_class
class ToolDefinitionChanged(Event):
    """The upstream served catalog ``tool`` with another definition than last recorded:
    ``seen_digest``; ``pinned_digest`` is the pin in force when it was seen."""

    tool: str
    pinned_digest: str
    seen_digest: str
