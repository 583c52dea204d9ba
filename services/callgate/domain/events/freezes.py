"""Freezes on the ``events`` topic (ADR 0054): applied and lifted by an operator."""

from __future__ import annotations

from callgate.domain.events.envelope import Event, event_class


@event_class
class FreezeApplied(Event):
    """An operator stopped every call of one tool, tenant or actor (``scope``: tool, tenant
    or actor; ``value``: its exact name), on every instance, from this event on."""

    scope: str
    value: str
    reason: str
    author: str
    tenant: str


@event_class
class FreezeLifted(Event):
    """An operator lifted the freeze of ``scope`` ``value``."""

    scope: str
    value: str
    reason: str
    author: str
    tenant: str
