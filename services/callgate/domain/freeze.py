"""Freezes: an operator's stop of one tool, tenant or actor on every instance (ADR 0054).

``FreezeApplied`` and ``FreezeLifted`` are events on the log; the set of freezes in force
is their fold in log order (``evolve``), pure and on an immutable value, so every decider
that reads the same events holds the same freezes after the same event. Matching is
exact: a freeze of ``refund`` does not stop ``Refund`` (identifiers compare exactly, ADR
0023).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from callgate.domain import events as ev
from callgate.domain.codes import Code, Rejection

FREEZE_EVENTS: tuple[type[ev.Event], ...] = (ev.FreezeApplied, ev.FreezeLifted)
SCOPES: tuple[str, ...] = ("tool", "tenant", "actor")
# Every freeze event shares one partition key, so on Kafka they keep one order.
FREEZE_KEY = "freeze"
MAX_VALUE_CHARS = 200
MAX_REASON_CHARS = 1_000


@dataclass(frozen=True, slots=True)
class Freeze:
    """One freeze in force: what it stops, who applied it, why."""

    scope: str
    value: str
    reason: str
    author: str
    applied_at: int

    def to_json(self) -> dict[str, object]:
        return {
            "scope": self.scope,
            "value": self.value,
            "reason": self.reason,
            "author": self.author,
            "applied_at": self.applied_at,
        }


@dataclass(frozen=True, slots=True)
class Freezes:
    """The freezes in force, by ``(scope, value)``; an immutable value folded from the log
    by ``evolve`` (a decider holds a reference and replaces it)."""

    active: Mapping[tuple[str, str], Freeze] = field(default_factory=lambda: MappingProxyType({}))

    def matching(self, tool: str, tenant: str, actor: str) -> Freeze | None:
        """The freeze that stops a call of ``tool`` by ``actor`` of ``tenant``, if any."""
        if not self.active:
            return None
        for key in (("tool", tool), ("tenant", tenant), ("actor", actor)):
            found = self.active.get(key)
            if found is not None:
                return found
        return None

    def check(self, tool: str, tenant: str, actor: str) -> None:
        """Raise ``frozen`` when a freeze stops this call."""
        found = self.matching(tool, tenant, actor)
        if found is not None:
            raise Rejection(
                Code.FROZEN,
                f"{found.scope} {found.value!r} is frozen: {found.reason}",
                {"scope": found.scope, "value": found.value},
            )


def evolve(freezes: Freezes, event: ev.Event) -> Freezes:
    """``freezes`` after ``event`` (any other type changes nothing: the same value)."""
    if isinstance(event, ev.FreezeApplied):
        freeze = Freeze(event.scope, event.value, event.reason, event.author, event.occurred_at)
        active = {**freezes.active, (event.scope, event.value): freeze}
    elif isinstance(event, ev.FreezeLifted) and (event.scope, event.value) in freezes.active:
        active = dict(freezes.active)
        del active[(event.scope, event.value)]
    else:
        return freezes
    return Freezes(MappingProxyType(active))


def checked_request(scope: str, value: str, reason: str, *, lifting: bool) -> None:
    """A freeze or unfreeze request's fields, checked before anything is published
    (``invalid_request`` naming the field otherwise). A value must be printable text as a
    catalog or session names it; nothing is normalized (matching is exact)."""
    if scope not in SCOPES:
        raise Rejection(Code.INVALID_REQUEST, f"scope {scope!r}: expected one of {SCOPES}")
    if not value or len(value) > MAX_VALUE_CHARS or not _printable(value) or value != value.strip():
        raise Rejection(
            Code.INVALID_REQUEST,
            f"--{scope}: 1 to {MAX_VALUE_CHARS} printable characters, no surrounding spaces",
        )
    if not lifting and not reason.strip():
        raise Rejection(Code.INVALID_REQUEST, "--reason: say why (it is recorded)")
    if len(reason) > MAX_REASON_CHARS or not _printable(reason):
        raise Rejection(
            Code.INVALID_REQUEST, f"--reason: at most {MAX_REASON_CHARS} printable characters"
        )


def _printable(text: str) -> bool:
    return all(unicodedata.category(c)[0] != "C" for c in text)


__all__ = [
    "FREEZE_EVENTS",
    "FREEZE_KEY",
    "SCOPES",
    "Freeze",
    "Freezes",
    "checked_request",
    "evolve",
]
