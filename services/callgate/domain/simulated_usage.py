"""What a candidate's usage limits would have counted on the recorded history (ADR 0079).

``policy simulate`` replays the history in log order. A recorded call that a candidate
limit covers reserves its amount in that limit's scope when it is decided, exactly as the
usage process would (``domain.usage.Book``: one implementation of the accounting), and
gives it back as the recorded history ended it: committed when the call ran (executed or
``outcome_uncertain``), released when it did not. A call the candidate's limits refuse
would not have run, so it counts nothing and the calls after it find that budget unused.
What ran is what counts: a call the recorded history refused counts for its own decision
only (whether it would have run is not known).

How the recorded history ended each call (``recorded_ends``) needs the history after its
decision, so the whole history is read first; the replay then folds it in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from callgate.domain import events as ev
from callgate.domain.canonical import derive_id
from callgate.domain.codes import Code
from callgate.domain.simulation import (
    APPROVAL_REQUIRED,
    EXECUTED,
    Change,
    LimitRefusal,
    Simulator,
    recorded_gate,
)
from callgate.domain.usage import Book, UsageLimit, Verdict, cedar_usage, changed, exceeded

# How the recorded history ended a decided call's hold on its usage.
RAN = "ran"  # executed or outcome_uncertain: committed
ENDED = "ended"  # failed, denied, expired, refused late, or granted for a new call: released
# Never counted: the order of checks put the call's end before the limits (C8 first).
REPLAYED = "replayed"  # served the original's outcome, or waited on its key
REFUSED = "refused"  # refused in its deciding step by a check before the limits
LIMIT_EXCEEDED = "limit_exceeded"  # refused by a recorded limit: it did not run

# The events ``recorded_ends`` and the replay read, in log order.
HISTORY_EVENTS: tuple[type[ev.Event], ...] = (
    ev.PolicyDecided,
    ev.ProposalRejected,
    ev.ApprovalRequested,
    ev.ApprovalGranted,
    ev.ApprovalDenied,
    ev.ApprovalExpired,
    ev.ExecutionRequested,
    ev.ReconciliationRequested,
    ev.ReplayServed,
    ev.ExecutionSucceeded,
    ev.ExecutionUncertain,
    ev.ExecutionFailed,
    ev.DryRunFailed,
    ev.UsageLimitChanged,
)


@dataclass(frozen=True, slots=True)
class RecordedEnd:
    """When (position in the history, time) and how a decided call's hold ended."""

    index: int
    at_ms: int
    how: str


@dataclass(slots=True)
class RecordedFates:
    """``ends``: by invocation, how its hold ended (absent: still held when the history
    ends, e.g. a pending approval). ``approver_for_limit``: calls a recorded limit sent to
    an approver (``over: approve``), whose recorded gate is an approval."""

    ends: dict[str, RecordedEnd] = field(default_factory=dict)
    approver_for_limit: set[str] = field(default_factory=set)


def recorded_ends(history: Sequence[ev.Event]) -> RecordedFates:
    """How the recorded history ended the hold of each call it decided (``HISTORY_EVENTS``
    in log order). An event in the deciding step shares the decision's ``causation_id``."""
    runs = {e.invocation_id for e in history if isinstance(e, ev.ExecutionRequested)}
    step: dict[str, str] = {}
    fates = RecordedFates()
    for index, e in enumerate(history):
        inv = e.invocation_id
        if isinstance(e, ev.PolicyDecided):
            step.setdefault(inv, e.causation_id)
            if e.decision != "permit" or e.evaluate_only:  # it went no further
                fates.ends.setdefault(inv, RecordedEnd(index, e.occurred_at, ENDED))
            continue
        if inv not in step or inv in fates.ends:
            continue
        deciding = e.causation_id == step[inv]
        if isinstance(e, ev.ApprovalRequested) and deciding and e.usage_json:
            fates.approver_for_limit.add(inv)
        how = _how(e, deciding, inv in runs)
        if how is not None:
            fates.ends[inv] = RecordedEnd(index, e.occurred_at, how)
    return fates


def _how(e: ev.Event, deciding: bool, runs: bool) -> str | None:
    match e:
        case ev.ExecutionSucceeded() | ev.ExecutionUncertain():
            return RAN
        case ev.ReplayServed():
            return REPLAYED
        case ev.ReconciliationRequested() if deciding:
            return REPLAYED  # waits on its key's uncertain original, which counted once
        case ev.ProposalRejected(code=code):
            if code == LIMIT_EXCEEDED:
                return LIMIT_EXCEEDED
            return REFUSED if deciding else ENDED
        case ev.ExecutionFailed() | ev.DryRunFailed() | ev.ApprovalDenied() | ev.ApprovalExpired():
            return ENDED
        case ev.ApprovalGranted() if not runs:
            return ENDED  # granted without continuing: the agent resubmits, a new call
    return None


@dataclass(frozen=True, slots=True)
class Reservation:
    """One candidate limit's answer to one call: the usage before it and the verdict."""

    limit: UsageLimit
    key: str
    amount: int
    limit_max: int  # the limit with what operators raised
    verdict: Verdict

    def refusal(self) -> dict[str, Any]:
        """The fields ``domain.usage.exceeded`` names a refusal by."""
        return {
            "limit": self.limit.name,
            "window": self.limit.window_name,
            "used": self.verdict.used,
            "max": self.limit_max,
            "amount": self.amount,
            "retry_after_ms": self.verdict.retry_after_ms,
        }


@dataclass(slots=True)
class CandidateUsage:
    """The candidate limits' books, one per scope key, as the usage process keeps them;
    the reservations each call holds."""

    books: dict[str, Book] = field(default_factory=dict)
    raised: dict[str, int] = field(default_factory=dict)
    held: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)

    def reserve(
        self,
        decided: ev.PolicyDecided,
        limits: Iterable[UsageLimit],
        args: Mapping[str, Any],
    ) -> list[Reservation]:
        """Each limit's reservation of what the call uses, at its decision's time."""
        found: list[Reservation] = []
        held = self.held.setdefault(decided.invocation_id, [])
        for limit in limits:
            key = limit.scope_key(decided.tenant, decided.actor, decided.agent, decided.tool)
            rid = derive_id("reservation", decided.invocation_id, limit.name)
            amount = limit.amount(args)
            limit_max = limit.max + self.raised.get(key, 0)
            verdict = self.books.setdefault(key, Book()).reserve(
                rid, amount, limit_max, decided.occurred_at, limit.window_ms,
                force=limit.over == "approve",
            )  # fmt: skip
            if verdict.reserved:
                held.append((key, rid, limit.window_ms))
            found.append(Reservation(limit, key, amount, limit_max, verdict))
        return found

    def settle(self, invocation_id: str, ran: bool, at_ms: int) -> None:
        """Commit (the call ran) or release what the call holds, as the decider settles
        it (a concurrency limit is released either way)."""
        for key, rid, window in self.held.pop(invocation_id, ()):
            book = self.books[key]
            if ran and window > 0:
                book.commit(rid, at_ms, window)
                book.prune(at_ms, window)
            else:
                book.release(rid)

    def change(self, e: ev.UsageLimitChanged) -> None:
        """An operator's recorded reset or raise of a scope (a candidate limit of the same
        name and scopes has the same key)."""
        book = self.books.setdefault(e.partition_key, Book())
        self.raised[e.partition_key] = changed(
            book, self.raised.get(e.partition_key, 0), e.action, e.raise_by
        )


def replay(
    simulator: Simulator,
    history: Sequence[ev.Event],
    *,
    tenant: str | None = None,
    since_ms: int | None = None,
) -> tuple[int, list[Change], list[LimitRefusal]]:
    """Decide the recorded ``history`` (``HISTORY_EVENTS`` in log order) again under the
    candidate, with its limits: how many decisions were decided (of ``tenant``, from
    ``since_ms``), the changes, and the calls its limits refuse.

    The order of checks is the decider's: the candidate's checks before its policy, then
    each covering limit reserves and the policy decides with ``context.usage``; a call
    its policy refuses, a replay and a call refused by a check before the limits give
    back what they reserved at once; a limit that refuses makes the call
    ``limit_exceeded``; ``over: approve`` past its limit makes it wait for an approver.
    Calls outside ``tenant`` and ``since_ms`` count too (they used the budget), unseen.
    """
    fates = recorded_ends(history)
    usage = CandidateUsage()
    due: dict[int, list[tuple[str, bool, int]]] = {}  # history index -> holds that end there
    decided = 0
    found: list[Change] = []
    refusals: list[LimitRefusal] = []
    for index, e in enumerate(history):
        for invocation_id, ran, at_ms in due.pop(index, ()):
            usage.settle(invocation_id, ran, at_ms)
        if isinstance(e, ev.UsageLimitChanged):
            usage.change(e)
            continue
        if not isinstance(e, ev.PolicyDecided):
            continue
        shown = (tenant is None or e.tenant == tenant) and (
            since_ms is None or e.occurred_at >= since_ms
        )
        limits = [] if e.evaluate_only else simulator.profile.limits_of(e.tool)
        if not shown and not limits:
            continue
        end = fates.ends.get(e.invocation_id)
        gate, why, refusal = _decide(simulator, e, limits, end, usage)
        goes_on = gate in (EXECUTED, APPROVAL_REQUIRED) and (end is None or _counted(end))
        if not goes_on or (end is not None and end.index == index):
            usage.settle(e.invocation_id, False, e.occurred_at)  # it goes no further
        elif end is not None:
            due.setdefault(end.index, []).append((e.invocation_id, end.how == RAN, end.at_ms))
        # else: still held when the history ends (a pending approval holds its usage)
        if not shown:
            continue
        decided += 1
        was = _recorded(e, fates)
        if gate != was:
            found.append(Change(e.invocation_id, e.tool, e.tenant, e.actor, was, gate, why))
        if refusal is not None:
            refusals.append(refusal)
    return decided, found, refusals


def _counted(end: RecordedEnd) -> bool:
    """Whether the order of checks reaches the limits for a call that ended so."""
    return end.how not in (REPLAYED, REFUSED)


def _decide(
    simulator: Simulator,
    e: ev.PolicyDecided,
    limits: Sequence[UsageLimit],
    end: RecordedEnd | None,
    usage: CandidateUsage,
) -> tuple[str, str, LimitRefusal | None]:
    """One recorded call's gate under the candidate, why, and its limits' refusal."""
    checked = simulator.checked(e)
    if isinstance(checked, tuple):
        return (*checked, None)  # refused before the limits: nothing reserved
    reservations = usage.reserve(e, limits, checked.args)
    gate, why = simulator.decide(e, checked, usage_context(reservations) if limits else None)
    if gate not in (EXECUTED, APPROVAL_REQUIRED) or (end is not None and not _counted(end)):
        return gate, why, None
    refused = next((r for r in reservations if not r.verdict.reserved), None)
    if refused is not None:
        rejection = exceeded(refused.refusal())
        refusal = LimitRefusal(
            e.invocation_id, e.tool, e.tenant, e.actor, e.occurred_at, rejection.details
        )
        return Code.LIMIT_EXCEEDED.value, rejection.message, refusal
    over = [r.limit.name for r in reservations if r.verdict.over]
    if over and gate == EXECUTED:
        return APPROVAL_REQUIRED, f"over {', '.join(over)}: an approver decides", None
    return gate, why, None


def _recorded(e: ev.PolicyDecided, fates: RecordedFates) -> str:
    """The recorded gate, with what the recorded limits did after the policy."""
    end = fates.ends.get(e.invocation_id)
    if end is not None and end.how == LIMIT_EXCEEDED:
        return Code.LIMIT_EXCEEDED.value
    gate = recorded_gate(e)
    if gate == EXECUTED and e.invocation_id in fates.approver_for_limit:
        return APPROVAL_REQUIRED
    return gate


def usage_context(reservations: Iterable[Reservation]) -> dict[str, dict[str, Any]]:
    """``context.usage`` for the candidate's policy, as the decider builds it."""
    return {
        r.limit.name: cedar_usage(r.verdict.used, r.limit.max, r.limit.window_name)
        for r in reservations
    }


__all__ = [
    "ENDED",
    "HISTORY_EVENTS",
    "LIMIT_EXCEEDED",
    "RAN",
    "REFUSED",
    "REPLAYED",
    "CandidateUsage",
    "RecordedEnd",
    "RecordedFates",
    "Reservation",
    "recorded_ends",
    "replay",
    "usage_context",
]
