"""Pinned upstream tools: a catalog entry stays bound to the definition it was reviewed
against (ADR 0066).

The digest of an upstream tool's definition covers what a model and callgate act on:
its name, description, input schema and annotations, as canonical JSON. A tool is pinned
by its catalog entry (``pin``) or by a ``ToolPinned`` event (``callgate catalog pin``),
the later one winning. A watcher records ``ToolDefinitionChanged`` when the upstream
serves another definition. The decider folds both, in log order. A pinned tool whose
last seen definition is not its pin is refused with ``tool_definition_changed`` until an
operator pins the new definition (or the upstream serves the pinned one again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json
from callgate.domain.codes import Code, Rejection

PIN_EVENTS: tuple[type[ev.Event], ...] = (ev.ToolPinned, ev.ToolDefinitionChanged)
# Every pin event shares one partition key, so on Kafka they keep one order (ADR 0064).
PINS_KEY = "pins"
PIN_PREFIX = "sha256:"


def evolve(pins: Pins, event: ev.Event) -> Pins:
    """``pins`` after ``event`` (any other type changes nothing: the same value)."""
    if isinstance(event, ev.ToolPinned):
        return Pins(
            MappingProxyType({**pins.pinned, event.tool: event.digest}),
            # pinned as the operator saw it served
            MappingProxyType({**pins.seen, event.tool: event.digest}),
        )
    if isinstance(event, ev.ToolDefinitionChanged):
        return Pins(pins.pinned, MappingProxyType({**pins.seen, event.tool: event.seen_digest}))
    return pins


def definition_digest(tool: Mapping[str, Any]) -> str:
    """The digest of an upstream tool's definition: ``name``, ``description``,
    ``inputSchema`` and ``annotations`` as the upstream lists them (absent: null)."""
    definition = {
        "name": tool.get("name"),
        "description": tool.get("description"),
        "inputSchema": tool.get("inputSchema"),
        "annotations": tool.get("annotations"),
    }
    return PIN_PREFIX + hashlib.sha256(canonical_json(definition).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Pins:
    """The pins recorded on the log and the definitions last seen, by catalog tool: an
    immutable value folded by ``evolve`` (a decider holds a reference and replaces it)."""

    pinned: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    seen: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def pin_of(self, tool: str, catalog_pin: str | None) -> str | None:
        """The pin in force: the last ``ToolPinned``, else the catalog entry's."""
        return self.pinned.get(tool, catalog_pin)

    def check(self, tool: str, catalog_pin: str | None) -> None:
        """Refuse ``tool`` when its last seen definition is not its pin."""
        pin = self.pin_of(tool, catalog_pin)
        seen = self.seen.get(tool)
        if pin is not None and seen is not None and seen != pin:
            raise Rejection(
                Code.TOOL_DEFINITION_CHANGED,
                f"the upstream's definition of {tool} changed (pinned {pin}, served {seen}); "
                "an operator must review it and pin it again (callgate catalog pin)",
            )
