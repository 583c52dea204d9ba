"""Usage limits on the ``events`` topic (ADR 0079): the reservations the invocations ask of
the usage process and its answers, commits and releases, and operators' changes.
"""

from __future__ import annotations

from callgate.domain.events.envelope import Event, event_class

# Keyed by a limit's scope (``UsageLimit.scope_key``) when they go to the usage process,
# by the invocation's partition key when they answer it.


@event_class
class UsageReserveRequested(Event):
    """The invocation asks its limit's usage to hold ``amount`` under ``reservation_id``;
    the limit as the deciding profile declares it travels along (the usage process keeps
    no profile). ``reply_key``: the invocation's partition key, where the answer goes."""

    limit: str
    reservation_id: str
    amount: int
    limit_max: int
    window_ms: int  # 0: calls in flight
    over: str  # "refuse" | "approve"
    reply_key: str
    tool: str
    scope_json: str  # the scope's exact values, canonical JSON
    window: str = ""  # ``UsageLimit.window_name``
    # What the proposal is decided from once every limit answers (ADR 0092: the decider's
    # state is a fold of its events). Empty in records written before.
    tenant: str = ""
    target: str = ""
    actor: str = ""
    agent: str = ""
    delegation: tuple[str, ...] = ()
    args_json: str = ""  # normalized, canonical JSON
    idempotency_key: str | None = None
    roles: tuple[str, ...] = ()
    session_id: str = ""
    session_expires_at: int = 0  # the session is checked again when the proposal is decided
    approval_id: str | None = None
    evaluate_only: bool = False
    access_request: bool = False
    facts_json: str = ""  # ``ResourceFacts.to_json``; empty for a call that creates one


@event_class
class UsageReserved(Event):
    """The amount is held; ``used`` is the usage before it. ``over_limit``: it went past
    the limit because the limit's ``over`` is ``approve`` (an approver decides)."""

    limit: str
    reservation_id: str
    scope_key: str
    amount: int
    used: int
    limit_max: int
    window_ms: int
    over_limit: bool


@event_class
class UsageRefused(Event):
    """The amount does not fit: nothing is held. ``retry_after_ms``: when it would fit as
    committed usage leaves the window (0: when calls in flight settle; -1: never)."""

    limit: str
    reservation_id: str
    scope_key: str
    amount: int
    used: int
    limit_max: int
    window_ms: int
    retry_after_ms: int


@event_class
class UsageCommitted(Event):
    """The reserved call ran (or may have: ``outcome_uncertain`` counts once): its amount
    counts for the window from ``occurred_at``."""

    limit: str
    reservation_id: str
    window_ms: int


@event_class
class UsageReleased(Event):
    """The reserved call will not run: what it held is given back."""

    limit: str
    reservation_id: str
    reason: str


@event_class
class UsageLimitChanged(Event):
    """An operator changed one limit's usage in one scope (keyed by the scope): ``reset``
    forgets what was committed (reservations stay held), ``raise`` adds ``raise_by`` to
    the scope's limit until the next reset. Authored by a verified operator, with a
    reason: the log is its audit."""

    limit: str
    scope_json: str  # the scope's exact values, canonical JSON
    action: str  # "reset" | "raise"
    raise_by: int
    reason: str
    author: str
    tenant: str  # the operator's tenant
