"""Usage limits (ADR 0079): the profile's ``limits:`` list and the window accounting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.unit.test_catalog import write_profile

from callgate.adapters.profiles import load_profile
from callgate.domain import events as ev
from callgate.domain.catalog import ProfileError
from callgate.domain.policy_versions import profile_of
from callgate.domain.usage import Book, UsageLimit, bucket_ms, retry_after_s, window_ms

REFUNDS: dict[str, Any] = {
    "name": "refunds-per-actor",
    "tools": ["refunds.issue"],
    "count": "sum",
    "arg": "amount_cents",
    "max": 100_000,
    "window": "24h",
    "per": ["actor"],
}


def with_limits(*limits: Any) -> Any:
    def edit(data: dict[str, Any]) -> None:
        data["limits"] = list(limits)

    return edit


def test_a_profile_reads_its_usage_limits(tmp_path: Path) -> None:
    tickets = {"name": "tickets", "tools": ["tickets.*"], "max": 50, "window": "1h",
               "per": ["actor", "agent"]}  # fmt: skip
    profile = load_profile(write_profile(tmp_path, with_limits(REFUNDS, tickets)))
    assert [limit.name for limit in profile.limits] == ["refunds-per-actor", "tickets"]
    assert [limit.name for limit in profile.limits_of("tickets.create")] == ["tickets"]
    assert profile.limits_of("users.delete") == []
    assert profile.limits[0].window_ms == 86_400_000
    assert profile.limits[1].over == "refuse"


def test_usage_limits_change_the_policy_version_and_none_keep_it(tmp_path: Path) -> None:
    base = load_profile(write_profile(tmp_path))
    limited = load_profile(write_profile(tmp_path, with_limits(REFUNDS)))
    assert limited.digest != base.digest
    assert load_profile(write_profile(tmp_path, with_limits())).digest == base.digest


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max": 0}, r"limits\[refunds-per-actor\]: max: Input should be greater than 0"),
        ({"window": "1 day"}, r"limits\[refunds-per-actor\]: Value error, window '1 day'"),
        ({"window": None}, r"count: sum needs a window"),
        ({"arg": None}, r"count: sum needs arg"),
        ({"arg": "currency"}, r"arg: tool 'refunds.issue' has no numeric argument 'currency'"),
        ({"arg": "nothing"}, r"arg: tool 'refunds.issue' has no numeric argument 'nothing'"),
        ({"per": ["actor", "team"]}, r"limits\[refunds-per-actor\]: per.1: Input should be"),
        ({"per": ["actor", "actor"]}, r"per names a scope twice"),
        ({"over": "warn"}, r"over: Input should be 'refuse' or 'approve'"),
        ({"tools": ["nope.*"]}, r"limits\[refunds-per-actor\]: tools: cover no tool"),
        ({"tools": []}, r"tools: Tuple should have at least 1 item"),
        ({"count": "in_flight", "arg": None}, r"count: in_flight has no window"),
        ({"colour": "red"}, r"colour: Extra inputs are not permitted"),
    ],
)
def test_a_malformed_limit_is_a_profile_error_naming_the_key(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    limit = {k: v for k, v in {**REFUNDS, **change}.items() if v is not None}
    with pytest.raises(ProfileError, match=message):
        load_profile(write_profile(tmp_path, with_limits(limit)))


def test_two_limits_of_one_name_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"limits\[refunds-per-actor\]: name: declared twice"):
        load_profile(write_profile(tmp_path, with_limits(REFUNDS, REFUNDS)))


def test_over_approve_needs_an_approver_role(tmp_path: Path) -> None:
    limit = {"name": "t", "tools": ["tickets.create"], "max": 5, "window": "1h",
             "over": "approve"}  # fmt: skip
    with pytest.raises(ProfileError, match=r"limits\[t\]: over: tool 'tickets.create' names no"):
        load_profile(write_profile(tmp_path, with_limits(limit)))


def test_the_old_mapping_form_names_entry_limits(tmp_path: Path) -> None:
    def old(data: dict[str, Any]) -> None:
        data["limits"] = data.pop("entry_limits")

    with pytest.raises(ProfileError, match="moved to entry_limits:"):
        load_profile(write_profile(tmp_path, old))


def test_a_version_published_with_the_old_form_still_reads_with_its_digest(
    tmp_path: Path,
) -> None:
    """Published content on the log keeps deciding after the upgrade (same digest)."""
    path = write_profile(tmp_path)
    current = load_profile(path)
    old_text = path.read_text().replace("entry_limits:", "limits:")
    published = ev.PolicyPublished(
        event_id="p", invocation_id="p", partition_key=ev.POLICY_KEY,
        version=current.digest, profile_yaml=old_text, policy_text=current.policy_text,
        author="op", tenant="acme", reason="before the upgrade",
    )  # fmt: skip
    assert profile_of(published).entry_limits == current.entry_limits


# --- scopes -----------------------------------------------------------------------------


def test_identifiers_are_exact_budgets() -> None:
    limit = UsageLimit.model_validate(REFUNDS)
    keys = {
        limit.scope_key("acme", "alice", "", "refunds.issue"),
        limit.scope_key("ACME", "alice", "", "refunds.issue"),
        limit.scope_key("acme", "Alice", "", "refunds.issue"),
        limit.scope_key("globex", "alice", "", "refunds.issue"),
    }
    assert len(keys) == 4
    # The agent is not in this limit's scope; the tool is not either.
    assert limit.scope_key("acme", "alice", "a1", "x") == limit.scope_key("acme", "alice", "", "y")


def test_the_tenant_is_always_part_of_the_key() -> None:
    per_tool = UsageLimit.model_validate({**REFUNDS, "per": ["tool"]})
    assert per_tool.scope_key("acme", "a", "", "t") != per_tool.scope_key("globex", "a", "", "t")
    assert per_tool.scope_of("acme", "a", "", "t") == {"tenant": "acme", "tool": "t"}


def test_amount_is_the_argument_rounded_up_and_never_negative() -> None:
    limit = UsageLimit.model_validate(REFUNDS)
    assert limit.amount({"amount_cents": 9999}) == 9999
    assert limit.amount({"amount_cents": 1.2}) == 2
    assert limit.amount({"amount_cents": -500}) == 0
    assert limit.amount({}) == 0
    assert UsageLimit.model_validate({**REFUNDS, "count": "calls", "arg": None}).amount({}) == 1


def test_windows() -> None:
    assert window_ms("1m") == 60_000 and window_ms("24h") == 86_400_000
    assert bucket_ms(60_000) == 1_000 and bucket_ms(3_600_000) == 60_000
    with pytest.raises(ValueError):
        window_ms("0h")
    with pytest.raises(ValueError):
        window_ms("400d")


# --- the accounting (property-based) -----------------------------------------------------

WINDOW = 60_000


def test_retry_after_names_when_the_next_call_fits() -> None:
    book = Book()
    assert book.reserve("a", 60, 100, 10_000, WINDOW, False).reserved
    book.commit("a", 10_500, WINDOW)
    refused = book.reserve("b", 50, 100, 20_000, WINDOW, False)
    assert not refused.reserved and refused.used == 60
    # bucket 10_000..11_000, counted until 71_000: 51 s from 20_000
    assert refused.retry_after_ms == 51_000 and retry_after_s(refused.retry_after_ms) == 51
    assert book.reserve("c", 50, 100, 71_000, WINDOW, False).reserved
    assert book.reserve("d", 101, 100, 71_000, WINDOW, False).retry_after_ms == -1
    assert retry_after_s(-1) is None


ops = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "commit", "release"]),
        st.integers(0, 30),  # reservation id
        st.integers(0, 40),  # amount
        st.integers(0, 5_000),  # time step, ms
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 100))
def test_no_sliding_window_ever_holds_more_than_the_limit(
    steps: list[tuple[str, int, int, int]], limit: int
) -> None:
    """Whatever the order of reserves, commits and releases: what is held plus what was
    committed in any window of the window's length never exceeds the limit; every
    release gives back exactly what was held."""
    book = Book()
    now = 0
    commits: list[tuple[int, int]] = []  # (time, amount) of every commit
    held: dict[str, int] = {}
    for op, rid_n, amount, step in steps:
        now += step
        rid = f"r{rid_n}"
        if op == "reserve":
            verdict = book.reserve(rid, amount, limit, now, WINDOW, False)
            if verdict.reserved and rid not in held:
                held[rid] = amount
        elif op == "commit":
            if book.commit(rid, now, WINDOW):
                commits.append((now, held.pop(rid)))
        else:
            before = sum(book.held.values())
            if book.release(rid):
                assert sum(book.held.values()) == before - held.pop(rid)
        assert book.held == held
        in_window = sum(a for t, a in commits if t > now - WINDOW)
        assert in_window + sum(held.values()) <= limit
        assert len(book.buckets) <= 62
    for rid in list(held):
        book.release(rid)
    assert book.held == {}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 20), max_size=60), st.integers(1, 50))
def test_a_refusal_says_truly_when_the_call_fits(amounts: list[int], limit: int) -> None:
    """Retrying at ``retry_after_ms`` (nothing else happening) is reserved; a millisecond
    earlier is not; -1 only for an amount over the limit on its own."""
    book = Book()
    now = 0
    for i, amount in enumerate(amounts):
        now += 700
        verdict = book.reserve(f"r{i}", amount, limit, now, WINDOW, False)
        if verdict.reserved:
            book.commit(f"r{i}", now, WINDOW)
            continue
        wait = verdict.retry_after_ms
        if wait == -1:  # never fits
            assert amount > limit
            continue
        assert wait > 0
        assert (
            not Book(book.held.copy(), [b.copy() for b in book.buckets])
            .reserve("x", amount, limit, now + wait - 1, WINDOW, False)
            .reserved
        )
        assert (
            Book(book.held.copy(), [b.copy() for b in book.buckets])
            .reserve("x", amount, limit, now + wait, WINDOW, False)
            .reserved
        )


def test_a_forced_reservation_goes_over_and_says_so() -> None:
    book = Book()
    assert book.reserve("a", 90, 100, 0, WINDOW, False).reserved
    forced = book.reserve("b", 20, 100, 0, WINDOW, True)
    assert forced.reserved and forced.over and forced.used == 90
    assert book.reserve("b", 20, 100, 0, WINDOW, False) == forced  # the same id: held once
    assert book.used(0, WINDOW) == 110


# --- the usage view holds what the usage process holds (ADR 0079) ---------------------------


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["ask", "commit", "release", "raise", "reset"]),
                  st.integers(0, 5), st.integers(1, 40), st.integers(0, 7_200_000)),
        max_size=40,
    )
)  # fmt: skip
# A commit seen twice, the second past the window: a no-op in both, pruning included.
@example(steps=[("ask", 0, 1, 0), ("commit", 0, 1, 0), ("commit", 0, 1, 3_660_000)])
def test_the_usage_view_folds_what_the_process_holds(
    steps: list[tuple[str, int, int, int]],
) -> None:
    """The same scope's events through the usage process and the usage projection: the
    view's held amount, committed buckets and limit are the process's, step by step, and
    ``used_now`` of the view is what the process would count."""
    from callgate.decider.usage_process import Usage
    from callgate.domain.usage import used_now
    from callgate_projections.usage import UsageProjection, value

    process, projection = Usage(), UsageProjection()
    state, view = process.initial_state(), projection.initial_state()
    at = 1_800_000_000_000
    common: dict[str, Any] = {"partition_key": "u-1", "limit": "l"}
    for n, (kind, rid, amount, dt) in enumerate(steps):
        at += dt
        event: ev.Event
        if kind == "ask":
            event = ev.UsageReserveRequested(
                event_id=f"e{n}", invocation_id=f"i{rid}", occurred_at=at, **common,
                reservation_id=f"r{rid}", amount=amount, limit_max=100,
                window_ms=3_600_000, over="refuse", reply_key="k",
                tool="t", scope_json='{"tenant":"acme"}',
            )  # fmt: skip
        elif kind == "commit":
            event = ev.UsageCommitted(
                event_id=f"e{n}", invocation_id=f"i{rid}", occurred_at=at,
                reservation_id=f"r{rid}", window_ms=3_600_000, **common,
            )  # fmt: skip
        elif kind == "release":
            event = ev.UsageReleased(
                event_id=f"e{n}", invocation_id=f"i{rid}", occurred_at=at,
                reservation_id=f"r{rid}", reason="x", **common,
            )  # fmt: skip
        else:
            event = ev.UsageLimitChanged(
                event_id=f"e{n}", invocation_id="limits", occurred_at=at, **common,
                scope_json='{"tenant":"acme"}', action=kind,
                raise_by=amount if kind == "raise" else 0, reason="r", author="olga",
                tenant="ops",
            )  # fmt: skip
        state, _ = process.handle(state, event, at)
        view, _ = projection.project(view, event)
        shown = value(view)
        assert dict(view.held) == state.book.held
        assert [list(b) for b in view.buckets] == state.book.buckets
        assert view.raised == state.raised
        assert used_now(shown, at) == state.book.used(at, 3_600_000)
