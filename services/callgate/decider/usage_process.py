"""The usage process: each limit's usage in each scope, keyed by the scope (ADR 0079).

A call's partition key is its idempotency key's (or its own id), but a limit counts per
scope (tenant, actor, agent, tool), so the calls one limit counts sit on many partitions
and instances. This process owns one scope's usage per key; invocations ask it as
events (``UsageReserveRequested``, keyed by the scope) and it answers keyed by the asking
invocation's partition key (``UsageReserved`` / ``UsageRefused``); the invocation settles
the reservation later (``UsageCommitted`` / ``UsageReleased``, keyed by the scope). Each
key's events are handled one at a time in log order, so no two reservations race.

Pure like the decider, and like it decide then evolve (ADR 0092): ``decide`` answers a
request from the state, ``evolve`` is the one place the immutable state changes, and the
state ``handle`` returns is ``evolve`` folded over the input and its answer. Time is the
asking event's ``occurred_at`` (the deciding step's clock), never the runner's, so
handling the log again gives the same answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from callgate.domain import events as ev
from callgate.domain.canonical import derive_id, state_json
from callgate.domain.process_port import Output
from callgate.domain.usage import Book, changed

PRODUCER = "usage"


@dataclass(frozen=True, slots=True)
class UsageState:
    """One scope key's usage (a key is one limit in one scope): the reservations ``held``
    (id -> amount) and the committed ``buckets`` (``(start_ms, amount)``, ascending), as
    ``domain.usage.Book`` counts them; immutable, changed by ``evolve`` alone."""

    held: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    buckets: tuple[tuple[int, int], ...] = ()
    limit: str = ""
    scope_json: str = "{}"
    limit_max: int = 0
    window_ms: int = 0
    raised: int = 0  # what operators added to this scope's limit (``limits raise``)

    @property
    def book(self) -> Book:
        """A working copy to count with (``Book`` changes in place)."""
        return Book(dict(self.held), [list(b) for b in self.buckets])


def _with_book(state: UsageState, book: Book, **changes: Any) -> UsageState:
    return replace(
        state,
        held=MappingProxyType(book.held),
        buckets=tuple((start, amount) for start, amount in book.buckets),
        **changes,
    )


def evolve(state: UsageState, event: ev.Event) -> UsageState:
    """``state`` after ``event`` (the same object when it changes nothing)."""
    if isinstance(event, ev.UsageReserveRequested):
        # The limit as the asking profile declares it; what left the window is dropped.
        book = state.book
        book.prune(event.occurred_at, event.window_ms)
        return _with_book(
            state,
            book,
            limit=event.limit,
            scope_json=event.scope_json,
            limit_max=event.limit_max,
            window_ms=event.window_ms,
        )
    if isinstance(event, ev.UsageReserved):  # the answer: the amount is held
        if event.reservation_id in state.held:
            return state
        held = {**state.held, event.reservation_id: event.amount}
        return replace(state, held=MappingProxyType(held))
    if isinstance(event, ev.UsageCommitted):
        # A reservation committed already (a commit seen twice) changes nothing, as in
        # the usage view: not even the pruning.
        book = state.book
        if not book.commit(event.reservation_id, event.occurred_at, event.window_ms):
            return state
        book.prune(event.occurred_at, event.window_ms)
        return _with_book(state, book)
    if isinstance(event, ev.UsageReleased):
        if event.reservation_id not in state.held:
            return state
        held = {k: v for k, v in state.held.items() if k != event.reservation_id}
        return replace(state, held=MappingProxyType(held))
    if isinstance(event, ev.UsageLimitChanged):
        book = state.book
        raised = changed(book, state.raised, event.action, event.raise_by)
        return _with_book(state, book, raised=raised)
    return state


def decide(state: UsageState, event: ev.Event) -> list[ev.Event]:
    """The answer to a reservation request (none to anything else)."""
    if not isinstance(event, ev.UsageReserveRequested):
        return []
    e = event
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
        return [ev.UsageReserved(**common, over_limit=verdict.over)]
    return [ev.UsageRefused(**common, retry_after_ms=verdict.retry_after_ms)]


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
                "held": dict(state.held),
                "buckets": state.buckets,
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
            MappingProxyType(dict(raw["held"])),
            tuple((start, amount) for start, amount in raw["buckets"]),
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
        """Decide, then evolve over the input and its answer."""
        if type(event) not in self.reacts_to:
            return state, ()
        answers = decide(state, event)
        for folded in (event, *answers):
            state = evolve(state, folded)
        return state, answers


__all__ = ["Usage", "UsageState", "decide", "evolve"]
