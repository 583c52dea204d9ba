"""What approvers are told (``callgate.domain.notices``) and the settings that say whom."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from callgate.config.sections import IssuerSettings, SlackSettings
from callgate.domain.notices import (
    DECIDED,
    PENDING,
    changes,
    decided_notice,
    pending_notice,
    retry_due,
    slack_action,
    slack_pending,
    wanted,
)

ROW: dict[str, Any] = {
    "invocation_id": "inv-1",
    "tenant": "acme",
    "tool": "refunds.issue",
    "actor": "alice",
    "target": "ORD-1",
    "args": {"order_id": "ORD-1", "amount_cents": 25000},
    "dry_run": {"refundable_cents": 10000, "refundable_after_cents": 7500},
    "policy_version": "pv",
    "args_hash": "ah",
    "dry_run_hash": "dh",
    "expires_at": 1_800_000_000_000,
    "requested_at": 1,
}


def test_an_item_that_appears_is_pending_and_one_that_leaves_is_decided() -> None:
    other = {**ROW, "invocation_id": "inv-2", "requested_at": 2}
    opened, closed = changes({"inv-1": ROW}, {"inv-2": other})
    assert [r["invocation_id"] for r in opened] == ["inv-2"]
    assert [r["invocation_id"] for r in closed] == ["inv-1"]
    assert changes({"inv-1": ROW}, {"inv-1": ROW}) == ([], [])


def test_the_pending_notice_carries_what_the_approval_binds_and_a_stable_id() -> None:
    n = pending_notice(ROW, "https://cg.example/")
    assert n.kind == PENDING and n.message_id == "approval.pending.inv-1"
    assert n.data["binds"]["dry_run_hash"] == "dh"
    assert n.data["console_url"] == "https://cg.example/#invocation=inv-1"
    body = json.loads(n.payload(0))
    assert body["type"] == PENDING and body["timestamp"] == "1970-01-01T00:00:00.000Z"
    d = decided_notice(ROW, {"approval": {"state": "denied", "approver": "fran", "reason": "no"}})
    assert d.kind == DECIDED and (d.data["decision"], d.data["approver"]) == ("denied", "fran")


def test_the_slack_message_has_approve_and_deny_for_the_invocation() -> None:
    text, blocks = slack_pending(pending_notice(ROW))
    assert "refunds.issue on ORD-1 by alice" in text
    [actions] = [b for b in blocks if b["type"] == "actions"]
    assert [e["value"] for e in actions["elements"]] == ["inv-1", "inv-1"]


def test_only_a_single_approve_or_deny_click_is_an_action() -> None:
    click = {
        "type": "block_actions",
        "team": {"id": "T1"},
        "user": {"id": "U1"},
        "actions": [{"action_id": "callgate_deny", "value": "inv-1"}],
    }
    action = slack_action(click)
    assert action is not None and (action.decision, action.slack_user) == ("deny", "U1")
    assert slack_action({**click, "type": "view_submission"}) is None
    assert slack_action({**click, "actions": [{"action_id": "other", "value": "x"}]}) is None
    assert slack_action({**click, "actions": []}) is None


def test_a_receiver_gets_only_its_events_of_its_tenants_compared_exactly() -> None:
    n = pending_notice(ROW)
    both = frozenset({PENDING, DECIDED})
    assert wanted(n, both, frozenset())
    assert wanted(n, both, frozenset({"acme"}))
    assert not wanted(n, both, frozenset({"ACME", "globex"}))
    assert not wanted(n, frozenset({DECIDED}), frozenset())


def test_retries_follow_the_delays_then_stop() -> None:
    assert [retry_due(n, (1, 5)) for n in (1, 2, 3)] == [1.0, 5.0, None]


def test_sign_in_and_slack_settings_refuse_incomplete_tables() -> None:
    with pytest.raises(ValidationError, match="redirect_uri"):
        IssuerSettings(issuer="https://idp", client_id="c")
    entry = IssuerSettings(issuer="https://idp", client_id="c", redirect_uri="https://cg/cb")
    assert entry.audience == "c" and entry.discovered_keys
    with pytest.raises(ValidationError, match="go together"):
        SlackSettings(bot_token="xoxb", channel="C1")
    with pytest.raises(ValidationError, match="mapped twice"):
        SlackSettings.model_validate(
            {"users": [{"slack_user": "U1", "user": "a", "tenant": "t"}] * 2}
        )
