"""The notifier resumes from its stored position (ADR 0040): an item decided while it was
down is told as decided after a restart, and one told before is not told as pending
again; an unreadable position falls back to telling everything pending (at least once).

The views are an in-memory ``PendingReader`` (the projections' rows as the HTTP server
reads them); the deliveries are the real ``Deliveries`` thread.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from callgate.adapters.keyfiles import generate_key_pair
from callgate.adapters.notify.deliveries import Deliveries
from callgate.adapters.notify.notifier import Notifier, build_notifier
from callgate.config.sections import NotifySettings, SlackSettings
from callgate.domain.notices import DECIDED, PENDING, Notice


class Views:
    """The pending and status views as rows (what ``serve --http`` reads)."""

    def __init__(self) -> None:
        self.pending: dict[str, dict[str, Any]] = {}
        self.status: dict[str, dict[str, Any]] = {}

    def view_items_raw(self, view: str) -> list[tuple[str, str]]:
        assert view == "pending"
        return [(k, json.dumps(v)) for k, v in self.pending.items()]

    def view(self, view: str, key: str) -> dict[str, Any] | None:
        assert view == "status"
        return self.status.get(key)

    def ask(self, inv: str) -> None:
        self.pending[inv] = {
            "invocation_id": inv, "tenant": "acme", "tool": "refunds.issue", "actor": "alice",
            "target": f"ORD-{inv}", "requested_at": len(self.pending),
        }  # fmt: skip
        self.status[inv] = {"approval": {"state": "pending"}}

    def decide(self, inv: str, state: str = "granted") -> None:
        del self.pending[inv]
        self.status[inv] = {"approval": {"state": state, "approver": "fran"}}


class Told:
    name = "recorder"
    events: frozenset[str] = frozenset({PENDING, DECIDED})
    tenants: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.notices: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def send(self, notice: Notice) -> None:
        with self.lock:
            self.notices.append((notice.kind, notice.invocation_id))

    def seen(self) -> list[tuple[str, str]]:
        with self.lock:
            return list(self.notices)


@pytest.fixture
def views() -> Views:
    return Views()


def told_in_one_run(
    views: Views, tmp: Path, position: Path, expected: list[tuple[str, str]]
) -> set[str]:
    """Start a notifier on ``position``; it tells exactly ``expected`` (no more, in any
    order); stop it; the invocations in the position it stored."""
    told = Told()
    deliveries = Deliveries((0.05,), tmp / "dead.jsonl", lambda: int(time.time() * 1000))
    notifier = Notifier(views, [told], deliveries, None, interval_s=0.02, position=position)
    notifier.start()
    try:
        deadline = time.monotonic() + 5
        while sorted(told.seen()) != sorted(expected):
            assert time.monotonic() < deadline, told.seen()
            time.sleep(0.02)
        time.sleep(0.2)  # and nothing more
        assert sorted(told.seen()) == sorted(expected)
    finally:
        notifier.stop()
    return set(json.loads(position.read_text())["told"])


@pytest.fixture
def position(tmp_path: Path) -> Path:
    return tmp_path / "notify-position.json"


def test_a_decision_made_while_the_notifier_was_down_is_told_after_restart(
    views: Views, tmp_path: Path, position: Path
) -> None:
    views.ask("a")
    views.ask("b")
    assert told_in_one_run(views, tmp_path, position, [(PENDING, "a"), (PENDING, "b")]) == {
        "a",
        "b",
    }
    views.decide("a")  # while no notifier runs
    views.ask("c")
    # a: decided (told once, now); b: still pending, told before (not again); c: new.
    assert told_in_one_run(views, tmp_path, position, [(DECIDED, "a"), (PENDING, "c")]) == {
        "b",
        "c",
    }


def test_without_a_readable_position_everything_pending_is_told_again(
    views: Views, tmp_path: Path, position: Path
) -> None:
    views.ask("a")
    position.write_text("{not json")
    assert told_in_one_run(views, tmp_path, position, [(PENDING, "a")]) == {"a"}  # rewritten


def test_an_item_leaving_the_view_while_its_status_lags_is_told_after_restart(
    views: Views, tmp_path: Path, position: Path
) -> None:
    """Left the pending view but its status still lags when the notifier stops: it stays
    in the position, so the restarted notifier tells its decision."""
    views.ask("a")
    row = views.pending.pop("a")  # decided, but the status view has not caught up yet
    position.write_text(json.dumps({"told": {"a": row}}))  # as a stopped notifier left it
    assert told_in_one_run(views, tmp_path, position, []) == {"a"}  # still waiting
    views.status["a"] = {"approval": {"state": "denied", "approver": "fran"}}
    assert told_in_one_run(views, tmp_path, position, [(DECIDED, "a")]) == set()


def test_an_instance_with_post_messages_false_takes_clicks_but_posts_nothing(
    tmp_path: Path,
) -> None:
    """Slack does not deduplicate: with several instances one posts, the others set
    ``post_messages = false`` and still verify clicks (their ``[slack]`` is complete)."""
    generate_key_pair(tmp_path / "keys", "session", "EdDSA", "slack-1")
    conf = {
        "bot_token": "xoxb-test",
        "signing_secret": "s" * 32,
        "channel": "C0APPROVALS",
        "session_kid": "slack-1",
        "session_key_file": tmp_path / "keys" / "slack-1.pem",
    }
    clock = lambda: int(time.time() * 1000)  # noqa: E731
    views = Views()
    quiet = SlackSettings.model_validate({**conf, "post_messages": False})
    assert quiet.configured
    assert build_notifier(views, NotifySettings(), quiet, tmp_path, clock) is None
    posting = SlackSettings.model_validate(conf)
    assert build_notifier(views, NotifySettings(), posting, tmp_path, clock) is not None
