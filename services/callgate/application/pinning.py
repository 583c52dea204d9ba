"""Pinned upstream tools (ADR 0066): what the upstreams serve, compared with the pins.

``served`` lists each MCP upstream's tools and digests the definition of every catalog
tool it serves. ``watch`` runs beside ``serve`` and ``callgate mcp``: at start and every
``[pinning] check_interval_s`` it records a ``ToolDefinitionChanged`` for each pinned tool
whose served definition is not the one last recorded. The decider refuses such a tool
(``domain.pins``), on every instance, because the event is on the log.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping

from callgate.domain import events as ev
from callgate.domain.catalog import Profile
from callgate.domain.pins import PIN_EVENTS, PINS_KEY, Pins, definition_digest
from callgate.domain.pins import evolve as pins_evolve
from callgate.providers.registry import ProviderRegistry

log = logging.getLogger(__name__)
# The seen digest of a catalog tool its upstream no longer lists.
ABSENT = "absent"


def served(providers: ProviderRegistry, only: str | None = None) -> dict[str, str]:
    """Catalog tool -> the digest of the definition its MCP upstream serves now (``ABSENT``
    when the upstream no longer lists it). An upstream that cannot be listed is left out
    (its calls fail at the upstream, coded, as before) and logged."""
    from callgate.providers.mcp import McpProvider

    found: dict[str, str] = {}
    for provider in providers.of_kind(McpProvider):
        tools = {
            name: spec
            for name, spec in provider.tools.items()
            if spec.upstream_method == "tools/call" and (only is None or name == only)
        }
        if not tools:
            continue
        try:
            listed = {t.name: t.model_dump(by_alias=True, exclude_none=True, mode="json")
                      for t in provider.upstream.list_tools()}  # fmt: skip
        except Exception as exc:  # an upstream down is not a definition change
            log.warning("pinning: cannot list the tools of provider %s: %s", provider.name, exc)
            continue
        for name, spec in tools.items():
            definition = listed.get(spec.upstream_name)
            found[name] = ABSENT if definition is None else definition_digest(definition)
    return found


def fold(events: Iterable[ev.Event]) -> Pins:
    return functools.reduce(pins_evolve, events, Pins())


def changes(profile: Profile, pins: Pins, now: Mapping[str, str], at: int) -> list[ev.Event]:
    """A ``ToolDefinitionChanged`` for each pinned tool served otherwise than last seen."""
    out: list[ev.Event] = []
    for tool, digest in sorted(now.items()):
        spec = profile.tool(tool)
        pin = pins.pin_of(tool, spec.pin if spec is not None else None)
        if pin is None or digest == pins.seen.get(tool, pin):
            continue
        out.append(pin_event(ev.ToolDefinitionChanged, at, tool=tool, pinned_digest=pin,
                             seen_digest=digest))  # fmt: skip
    return out


def pin_event(cls: Callable[..., ev.Event], at: int, **fields: str) -> ev.Event:
    event_id = uuid.uuid4().hex
    return cls(
        event_id=event_id,
        invocation_id=f"{PINS_KEY}-{event_id}",
        partition_key=PINS_KEY,
        correlation_id=event_id,
        occurred_at=at,
        producer="callgate",
        **fields,
    )


def watch(
    providers: ProviderRegistry,
    check: Callable[[], object],
    interval_s: float,
    stop: threading.Event,
) -> threading.Thread | None:
    """Run ``check`` now and every ``interval_s`` until ``stop``, in a daemon thread; a
    failed check is logged and tried again at the next interval. Without an MCP upstream
    there is nothing to pin: no thread, so no client is made and nothing is logged."""
    from callgate.providers.mcp import McpProvider

    if not providers.of_kind(McpProvider):
        return None

    def loop() -> None:
        while not stop.is_set():
            try:
                check()
            except Exception:
                log.exception("pinning: the check of the upstream definitions failed")
            stop.wait(interval_s)

    thread = threading.Thread(target=loop, name="callgate-pinning", daemon=True)
    thread.start()
    return thread


__all__ = ["ABSENT", "PIN_EVENTS", "changes", "fold", "pin_event", "served", "watch"]
