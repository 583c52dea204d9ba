"""Usage view: each limit's usage in each scope (ADR 0079), what operators read.

View ``usage``, key = the scope key (``u-`` + hash of the limit and the scope's values),
the partition key of every event that changes it. The usage process answers reservations
by folding the same events of the same key in the same order with ``domain.usage.Book``;
this projection folds them the same way, so its view holds exactly what the process
holds, and ``callgate replay`` rebuilds and compares it like every view.

The value keeps the committed buckets, not a total: what counts depends on the reader's
time (a bucket leaves the window), and a view rebuilt from the log must not read a clock.
``domain.usage.used_now`` turns a value into what is used at a given time.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from callgate.domain.canonical import state_json
from callgate.domain.events import (
    Event,
    UsageCommitted,
    UsageLimitChanged,
    UsageReleased,
    UsageReserveRequested,
)
from callgate.domain.usage import Book, changed
from callgate_projections import Projection, ViewRecord, parse_json_field

VIEW = "usage"
MAX_CHANGES = 20  # the operators' changes a value keeps, newest last


@dataclass(frozen=True, slots=True)
class UsageViewState:
    """One scope key's book and what the view shows of its limit (a fresh object on every
    change: projections keep their states immutable)."""

    held: tuple[tuple[str, int], ...] = ()
    buckets: tuple[tuple[int, int], ...] = ()
    limit: str = ""
    scope_json: str = "{}"
    limit_max: int = 0
    window_ms: int = 0
    raised: int = 0  # what operators added to the limit (``limits raise``)
    changes: tuple[tuple[str, int, str, str, int], ...] = ()  # action, by, author, reason, at
    updated_at: int = 0

    def book(self) -> Book:
        return Book(dict(self.held), [list(b) for b in self.buckets])


def _with(state: UsageViewState, book: Book, **changes: Any) -> UsageViewState:
    return replace(
        state,
        held=tuple(sorted(book.held.items())),
        buckets=tuple((b[0], b[1]) for b in book.buckets),
        **changes,
    )


def project(state: UsageViewState, event: Event) -> tuple[UsageViewState, tuple[ViewRecord, ...]]:
    book = state.book()
    match event:
        case UsageReserveRequested():
            limit_max = event.limit_max + state.raised
            book.reserve(
                event.reservation_id, event.amount, limit_max, event.occurred_at,
                event.window_ms, force=event.over == "approve",
            )  # fmt: skip
            new = _with(
                state, book, limit=event.limit, scope_json=event.scope_json,
                limit_max=event.limit_max, window_ms=event.window_ms,
                updated_at=event.occurred_at,
            )  # fmt: skip
        case UsageCommitted():
            if not book.commit(event.reservation_id, event.occurred_at, event.window_ms):
                return state, ()
            book.prune(event.occurred_at, event.window_ms)
            new = _with(state, book, updated_at=event.occurred_at)
        case UsageReleased():
            if not book.release(event.reservation_id):
                return state, ()
            new = _with(state, book, updated_at=event.occurred_at)
        case UsageLimitChanged():
            raised = changed(book, state.raised, event.action, event.raise_by)
            change = (event.action, event.raise_by, event.author, event.reason, event.occurred_at)
            new = _with(
                state, book, limit=event.limit, scope_json=event.scope_json, raised=raised,
                changes=(*state.changes, change)[-MAX_CHANGES:], updated_at=event.occurred_at,
            )  # fmt: skip
        case _:
            return state, ()
    return new, (ViewRecord.of(VIEW, event.partition_key, value(new)),)


def scope_of(scope_json: str) -> dict[str, str | None]:
    """The scope's values as the view's schema has them (a scope not in ``per``: null)."""
    raw = parse_json_field(scope_json, "scope_json")
    found = raw if isinstance(raw, dict) else {}
    scope: dict[str, str | None] = {k: None for k in ("actor", "agent", "tool")}
    scope |= {k: str(found[k]) for k in scope if k in found}
    return {"tenant": str(found.get("tenant", "")), **scope}


def value(state: UsageViewState) -> dict[str, Any]:
    return {
        "limit": state.limit,
        "scope": scope_of(state.scope_json),
        "max": state.limit_max + state.raised,
        "raised": state.raised,
        "window_ms": state.window_ms,
        "held": sum(a for _, a in state.held),
        "reservations": len(state.held),
        "buckets": [{"start": s, "amount": a} for s, a in state.buckets],
        "changes": [
            {"action": a, "raise_by": by, "author": who, "reason": why, "at": at}
            for a, by, who, why, at in state.changes
        ],
        "updated_at": state.updated_at,
    }


class UsageProjection(Projection[UsageViewState]):
    name = "usage-projection"
    views = frozenset({VIEW})
    reacts_to = frozenset({UsageReserveRequested, UsageCommitted, UsageReleased, UsageLimitChanged})

    def initial_state(self) -> UsageViewState:
        return UsageViewState()

    def project(
        self, state: UsageViewState, event: Event
    ) -> tuple[UsageViewState, Sequence[ViewRecord]]:
        return project(state, event)

    def dump_state(self, state: UsageViewState) -> bytes:
        return state_json(
            {
                "held": [list(h) for h in state.held],
                "buckets": [list(b) for b in state.buckets],
                "limit": state.limit,
                "scope_json": state.scope_json,
                "limit_max": state.limit_max,
                "window_ms": state.window_ms,
                "raised": state.raised,
                "changes": [list(c) for c in state.changes],
                "updated_at": state.updated_at,
            }
        )

    def load_state(self, data: bytes) -> UsageViewState:
        raw: dict[str, Any] = json.loads(data)
        return UsageViewState(
            held=tuple((str(r), int(a)) for r, a in raw["held"]),
            buckets=tuple((int(s), int(a)) for s, a in raw["buckets"]),
            limit=raw["limit"],
            scope_json=raw["scope_json"],
            limit_max=raw["limit_max"],
            window_ms=raw["window_ms"],
            raised=raw["raised"],
            changes=tuple(
                (str(a), int(by), str(who), str(why), int(at))
                for a, by, who, why, at in raw["changes"]
            ),
            updated_at=raw["updated_at"],
        )


__all__ = ["VIEW", "UsageProjection", "UsageViewState", "project", "value"]
