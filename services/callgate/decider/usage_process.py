"""The usage process: each limit's usage in each scope, keyed by the scope (ADR 0079).

A call's partition key is its idempotency key's (or its own id), but a limit counts per
scope (tenant, actor, agent, tool), so the calls one limit counts sit on many partitions
and instances. This process owns one scope's ``Book`` per key; invocations ask it as
events (``UsageReserveRequested``, keyed by the scope) and it answers keyed by the asking
invocation's partition key (``UsageReserved`` / ``UsageRefused``); the invocation settles
the reservation later (``UsageCommitted`` / ``UsageReleased``, keyed by the scope). Each
key's events are handled one at a time in log order, so no two reservations race.

Pure like the decider: time is the asking event's ``occurred_at`` (the deciding step's
clock), never the runner's, so handling the log again gives the same answers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from callgate.domain import events as ev
from callgate.domain.canonical import derive_id, state_json
from callgate.domain.process_port import Output
from callgate.domain.usage import Book, changed

PRODUCER = "usage"


@dataclass(slots=True)
class UsageState:
    """One scope key's usage: its ``Book`` (a key is one limit in one scope)."""

    book: Book = field(default_factory=Book)
    limit: str = ""
    scope_json: str = "{}"
    limit_max: int = 0
    window_ms: int = 0
    raised: int = 0  # what operators added to this scope's limit (``limits raise``)


class Usage:
    """Holds, commits and releases the reservations of one limit's scope per key."""

    name = "usage"
    inputs = frozenset({"events"})
    recovers = False
    reacts_to: frozenset[type[ev.Event]] = frozenset(
        {ev.UsageReserveRequested, ev.UsageCommitted, ev.UsageReleased, ev.UsageLimitChanged}
    )
    # The invocation that asks waits for the answer (``callgate.domain.process_port.answered_by``).
    answers: frozenset[type[ev.Event]] = frozenset({ev.UsageReserveRequested})

    def initial_state(self) -> UsageState:
        return UsageState()

    def dump_state(self, state: UsageState) -> bytes:
        return state_json(
            {
                "held": state.book.held,
                "buckets": state.book.buckets,
                "limit": state.limit,
                "scope_json": state.scope_json,
                "limit_max": state.limit_max,
                "window_ms": state.window_ms,
                "raised": state.raised,
            }
        )

    def load_state(self, data: bytes) -> UsageState:
        raw: dict[str, Any] = json.loads(data)
        return UsageState(
            Book(dict(raw["held"]), [list(b) for b in raw["buckets"]]),
            raw["limit"],
            raw["scope_json"],
            raw["limit_max"],
            raw["window_ms"],
            raw.get("raised", 0),
        )

    def next_due(self, state: UsageState) -> int | None:
        return None

    def due(self, state: UsageState, now_ms: int) -> tuple[UsageState, Sequence[Output]]:
        return state, ()

    def follow_up(
        self, state: UsageState, committed: Sequence[ev.Event], now_ms: int
    ) -> tuple[UsageState, Sequence[Output]]:
        return state, ()

    def recover(self, state: UsageState, now_ms: int) -> tuple[UsageState, Sequence[Output]]:
        return state, ()

    def handle(
        self, state: UsageState, event: ev.Event, now_ms: int
    ) -> tuple[UsageState, Sequence[Output]]:
        book = state.book
        if isinstance(event, ev.UsageReserveRequested):
            return state, [self._reserve(state, event)]
        if isinstance(event, ev.UsageCommitted):
            # A reservation committed already (a commit seen twice) changes nothing, as
            # in the usage view: not even the pruning.
            if book.commit(event.reservation_id, event.occurred_at, event.window_ms):
                book.prune(event.occurred_at, event.window_ms)
        elif isinstance(event, ev.UsageReleased):
            book.release(event.reservation_id)
        elif isinstance(event, ev.UsageLimitChanged):
            state.raised = changed(book, state.raised, event.action, event.raise_by)
        return state, ()

    def _reserve(self, state: UsageState, e: ev.UsageReserveRequested) -> ev.Event:
        state.limit, state.scope_json = e.limit, e.scope_json
        state.limit_max, state.window_ms = e.limit_max, e.window_ms
        verdict = state.book.reserve(
            e.reservation_id,
            e.amount,
            e.limit_max + state.raised,
            e.occurred_at,
            e.window_ms,
            force=e.over == "approve",
        )
        common: dict[str, Any] = {
            "event_id": derive_id(e.event_id, "0", "usage"),
            "invocation_id": e.invocation_id,
            "partition_key": e.reply_key,
            "causation_id": e.event_id,
            "correlation_id": e.correlation_id or e.invocation_id,
            "occurred_at": e.occurred_at,
            "producer": PRODUCER,
            "limit": e.limit,
            "reservation_id": e.reservation_id,
            "scope_key": e.partition_key,
            "amount": e.amount,
            "used": verdict.used,
            "limit_max": e.limit_max + state.raised,
            "window_ms": e.window_ms,
        }
        if verdict.reserved:
            return ev.UsageReserved(**common, over_limit=verdict.over)
        return ev.UsageRefused(**common, retry_after_ms=verdict.retry_after_ms)


__all__ = ["Usage", "UsageState"]
