"""Usage limits: what a profile's ``limits:`` declare, and the exact window accounting.

A limit caps what the calls of the tools it covers may use per scope (ADR 0079): the number
of calls, the sum of a numeric argument (``amount_cents``) over a window, or the calls in
flight. Pure: no clock, no I/O; time is passed in as epoch milliseconds.

The window slides, in buckets of a sixtieth of the window (at least a second): an amount
committed at ``t`` counts until the end of its bucket plus the window, so never less than a
window after ``t``. No sliding window of the window's length can ever hold more than the
limit (a fixed window lets twice the limit through across a boundary), and a scope keeps at
most 62 buckets whatever the traffic (a log of every call would grow with the limit).
The cost of the buckets is only a later retry: an amount counts up to a sixtieth of the
window longer than it has to. Reservations (calls decided, not yet settled) count until
they are committed or released, whatever their age.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from callgate.domain.canonical import canonical_json, sha256_hex
from callgate.domain.codes import Code, Rejection

SCOPES = ("tenant", "actor", "agent", "tool")
_WINDOW = re.compile(r"^([1-9][0-9]{0,5})(s|m|h|d)$")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
BUCKETS_PER_WINDOW = 60
MIN_BUCKET_MS = 1_000
MAX_WINDOW_MS = 366 * 86_400_000
Scope = Literal["tenant", "actor", "agent", "tool"]
# The catalog's alphabet of names (``catalog.Name``; this module sits below the catalog).
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$", max_length=128)]
ToolGlob = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:*?\[\]-]{1,128}$")]


def window_ms(text: str) -> int:
    """``1m``, ``1h``, ``24h``, ``7d`` in milliseconds; ``ValueError`` for anything else."""
    found = _WINDOW.match(text)
    if found is None:
        raise ValueError(f"window {text!r}: a whole number and one of s, m, h, d (e.g. 1h)")
    value = int(found.group(1)) * _UNIT_MS[found.group(2)]
    if value > MAX_WINDOW_MS:
        raise ValueError(f"window {text!r}: at most 366d")
    return value


def bucket_ms(window: int) -> int:
    """The width of one bucket of ``window``."""
    return max(MIN_BUCKET_MS, window // BUCKETS_PER_WINDOW)


class UsageLimit(BaseModel):
    """One entry of a profile's ``limits:`` list (docs/how-to/limits.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Name
    tools: tuple[ToolGlob, ...] = Field(min_length=1)
    count: Literal["calls", "sum", "in_flight"] = "calls"
    arg: Name | None = None  # the numeric argument summed, with ``count: sum``
    max: int = Field(gt=0, le=2**53 - 1)
    window: str | None = None  # with ``calls`` and ``sum``; none with ``in_flight``
    per: tuple[Scope, ...] = ("tenant",)
    over: Literal["refuse", "approve"] = "refuse"

    @model_validator(mode="after")
    def _consistent(self) -> UsageLimit:
        if self.count == "sum" and self.arg is None:
            raise ValueError("count: sum needs arg, the numeric argument summed")
        if self.count != "sum" and self.arg is not None:
            raise ValueError("arg is only for count: sum")
        if self.count == "in_flight":
            if self.window is not None:
                raise ValueError("count: in_flight has no window (calls in flight now)")
        elif self.window is None:
            raise ValueError(f"count: {self.count} needs a window such as 1m, 1h or 24h")
        else:
            window_ms(self.window)
        if len(set(self.per)) != len(self.per):
            raise ValueError("per names a scope twice")
        return self

    @property
    def window_ms(self) -> int:
        return 0 if self.window is None else window_ms(self.window)

    @property
    def window_name(self) -> str:
        """How answers, Cedar and views name the window (``in_flight``: none)."""
        return self.window or "in_flight"

    def covers(self, tool: str) -> bool:
        """Exact names or globs, case-sensitive like every identifier."""
        return any(fnmatchcase(tool, pattern) for pattern in self.tools)

    def scope_key(self, tenant: str, actor: str, agent: str, tool: str) -> str:
        """The partition key of this limit's usage for one call: the tenant always, then the
        scopes of ``per``, compared exactly (``ACME`` and ``acme`` are two budgets)."""
        values = {"tenant": tenant, "actor": actor, "agent": agent, "tool": tool}
        parts = [self.name, tenant, *[[s, values[s]] for s in self.per if s != "tenant"]]
        return "u-" + sha256_hex(canonical_json(parts))[:32]

    def scope_of(self, tenant: str, actor: str, agent: str, tool: str) -> dict[str, str]:
        """The scope's values, for answers and views."""
        values = {"tenant": tenant, "actor": actor, "agent": agent, "tool": tool}
        return {"tenant": tenant} | {s: values[s] for s in self.per}

    def amount(self, args: Mapping[str, Any]) -> int:
        """What one call uses: 1, or the argument's value (rounded up; a missing or
        negative value uses nothing, it never gives budget back)."""
        if self.count != "sum":
            return 1
        value = args.get(self.arg or "")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return 0
        return max(0, math.ceil(value))


def schema_problem(limit: UsageLimit, tool: str, args_schema: Mapping[str, Any]) -> str | None:
    """Why ``limit`` cannot count ``tool`` (a summed argument its schema lacks), or None."""
    if limit.count != "sum":
        return None
    prop = args_schema.get("properties", {}).get(limit.arg)
    kinds = prop.get("type") if isinstance(prop, dict) else None
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if not any(k in ("integer", "number") for k in kinds):
        return f"tool '{tool}' has no numeric argument '{limit.arg}' to sum"
    return None


def parse_limits(raw: Any) -> tuple[UsageLimit, ...]:
    """``limits:`` as written; ``ValueError`` naming the entry and field (the caller adds
    the file). The old mapping form of entry limits names its new key."""
    if raw is None:
        return ()
    if isinstance(raw, dict):
        raise ValueError(
            "limits: is the list of usage limits; the entry limits max_args_bytes and "
            "max_depth moved to entry_limits: (docs/how-to/upgrades.md)"
        )
    if not isinstance(raw, list):
        raise ValueError("limits: expected a list of usage limits")
    from pydantic import ValidationError

    found: list[UsageLimit] = []
    for i, body in enumerate(raw):
        name = body.get("name", i) if isinstance(body, dict) else i
        where = f"limits[{name}]"
        try:
            found.append(UsageLimit.model_validate(body))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{where}: {loc + ': ' if loc else ''}{first['msg']}") from None
    names = [limit.name for limit in found]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"limits[{name}]: name: declared twice")
    return tuple(found)


# --- the accounting of one scope --------------------------------------------------------


@dataclass(slots=True)
class Book:
    """The usage of one limit in one scope: reservations held and committed buckets.

    ``held``: reservation id -> amount, counted until settled. ``buckets``: ``[start_ms,
    amount]`` pairs in ascending start, each counted until ``start + width + window``.
    """

    held: dict[str, int] = field(default_factory=dict)
    buckets: list[list[int]] = field(default_factory=list)

    def committed(self, now_ms: int, window: int) -> int:
        width = bucket_ms(window) if window else 0
        return sum(a for start, a in self.buckets if start + width + window > now_ms)

    def used(self, now_ms: int, window: int) -> int:
        return self.committed(now_ms, window) + sum(self.held.values())

    def prune(self, now_ms: int, window: int) -> None:
        width = bucket_ms(window) if window else 0
        self.buckets = [b for b in self.buckets if b[0] + width + window > now_ms]

    def reserve(
        self, rid: str, amount: int, limit: int, now_ms: int, window: int, force: bool
    ) -> Verdict:
        """Hold ``amount`` under ``rid`` when it fits (or when ``force``: an approver will
        decide); the verdict carries the usage before it. The same ``rid`` twice is
        answered as the first time and held once."""
        self.prune(now_ms, window)
        if rid in self.held:
            used = self.used(now_ms, window) - self.held[rid]
            return Verdict(True, used, used + self.held[rid] > limit, 0)
        used = self.used(now_ms, window)
        fits = used + amount <= limit
        if fits or force:
            self.held[rid] = amount
            return Verdict(True, used, not fits, 0)
        return Verdict(False, used, True, self.retry_after(amount, limit, now_ms, window))

    def commit(self, rid: str, now_ms: int, window: int) -> bool:
        """The reserved call ran: its amount counts from ``now_ms`` for the window (a
        concurrency limit has no window: committing ends it as releasing does)."""
        amount = self.held.pop(rid, None)
        if amount is None:
            return False
        if window and amount:
            start = now_ms - now_ms % bucket_ms(window)
            if self.buckets and self.buckets[-1][0] == start:
                self.buckets[-1][1] += amount
            else:
                self.buckets.append([start, amount])
                self.buckets.sort(key=lambda b: b[0])
        return True

    def release(self, rid: str) -> bool:
        return self.held.pop(rid, None) is not None

    def retry_after(self, amount: int, limit: int, now_ms: int, window: int) -> int:
        """Milliseconds until ``amount`` fits as the committed buckets expire; 0 when only
        the reservations held stand in the way (they settle when their calls do), -1 when
        it never fits (more than the limit on its own)."""
        if amount > limit:
            return -1
        held = sum(self.held.values())
        width = bucket_ms(window) if window else 0
        over = self.committed(now_ms, window) + held + amount - limit
        for start, a in self.buckets:
            end = start + width + window
            if end <= now_ms:
                continue
            over -= a
            if over <= 0:
                return end - now_ms
        return 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """A reservation's answer: reserved or not, the usage before it, whether it goes over
    the limit (only with ``force``) and when to retry (ms; see ``Book.retry_after``)."""

    reserved: bool
    used: int
    over: bool
    retry_after_ms: int


def changed(book: Book, raised: int, action: str, raise_by: int) -> int:
    """An operator's ``limits reset`` or ``raise`` applied to one scope's ``book``; what is
    raised after it. A reset forgets what ran (calls in flight still hold) and any raise."""
    if action == "reset":
        book.buckets = []
        return 0
    return raised + raise_by


def cedar_usage(used: int, limit_max: int, window: str) -> dict[str, Any]:
    """One limit's entry of ``context.usage``: what was used before the call."""
    return {"used": used, "limit": limit_max, "window": window}


def exceeded(u: Mapping[str, Any]) -> Rejection:
    """``limit_exceeded`` for the reservation ``u`` that a limit refused (``limit``,
    ``window``, ``used``, ``max``, ``amount``, ``retry_after_ms``): the message and the
    details say when the call fits."""
    retry = retry_after_s(u["retry_after_ms"])
    if u["retry_after_ms"] == 0:
        retry = 1  # only calls in flight stand in the way: they settle soon
    window = u["window"]
    when = "never (more than the limit on its own)" if retry is None else f"in {retry} s"
    return Rejection(
        Code.LIMIT_EXCEEDED,
        f"limit {u['limit']} exceeded: {u['used']} of {u['max']} used"
        + ("" if window == "in_flight" else f" in {window}")
        + f", this call needs {u['amount']}; retry {when}",
        {
            "limit": u["limit"],
            "window": window,
            "used": u["used"],
            "max": u["max"],
            "amount": u["amount"],
            "retry_after_s": retry,
        },
    )


def retry_after_s(retry_after_ms: int) -> int | None:
    """Whole seconds for ``Retry-After``, rounded up; None when it never fits."""
    if retry_after_ms < 0:
        return None
    return max(1, math.ceil(retry_after_ms / 1000))


def used_now(value: Mapping[str, Any], now_ms: int) -> int:
    """What a ``usage`` view value counts at ``now_ms``: held plus the committed buckets
    still inside the window (the view keeps buckets: a view cannot read a clock)."""
    window = int(value["window_ms"])
    book = Book({}, [[int(b["start"]), int(b["amount"])] for b in value["buckets"]])
    return book.committed(now_ms, window) + int(value["held"])


def covering(limits: Sequence[UsageLimit], tool: str) -> list[UsageLimit]:
    return [limit for limit in limits if limit.covers(tool)]


__all__ = [
    "SCOPES",
    "Book",
    "UsageLimit",
    "Verdict",
    "bucket_ms",
    "cedar_usage",
    "changed",
    "covering",
    "exceeded",
    "parse_limits",
    "retry_after_s",
    "schema_problem",
    "used_now",
    "window_ms",
]
