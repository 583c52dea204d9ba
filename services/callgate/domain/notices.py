"""What approvers are told, and when (ADR 0032): pure, given the pending view's rows.

The notifier (``callgate.adapters.notify``) reads the pending view, a projection of the
pending-approval events, and hands each new snapshot here with the last one: an item
that appears is ``approval.pending``; one that leaves is ``approval.decided`` with its
status (granted, denied, expired). This module builds the webhook payloads and the Slack
Block Kit messages; it sends nothing and reads no clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

Kind = Literal["approval.pending", "approval.decided", "access_request.decided"]
PENDING: Kind = "approval.pending"
DECIDED: Kind = "approval.decided"
# An ARAP access request's task reached a terminal status (ADR 0090): the callback the
# PEP asked for, to the webhook it names.
ACCESS_REQUEST_DECIDED: Kind = "access_request.decided"
APPROVE_ACTION = "callgate_approve"
DENY_ACTION = "callgate_deny"
MAX_SLACK_TEXT = 2900  # Slack's section text limit is 3000 characters


@dataclass(frozen=True)
class Notice:
    """One thing to tell: its kind, the invocation and the payload's ``data``.

    ``message_id`` is the Standard Webhooks ``webhook-id``: the same for every attempt
    and every instance, so a receiver drops repeats by it.
    """

    kind: Kind
    invocation_id: str
    tenant: str
    data: Mapping[str, Any]

    @property
    def message_id(self) -> str:
        return f"{self.kind}.{self.invocation_id}"

    def payload(self, at_ms: int) -> str:
        """The Standard Webhooks body: ``{"type", "timestamp", "data"}``."""
        stamp = datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds")
        body = {"type": self.kind, "timestamp": stamp.replace("+00:00", "Z"), "data": self.data}
        return json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def changes(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The rows that appeared in the pending view and those that left it, in order."""
    opened = [row for key, row in after.items() if key not in before]
    closed = [row for key, row in before.items() if key not in after]
    order = lambda r: (r.get("requested_at", 0), str(r.get("invocation_id", "")))  # noqa: E731
    return sorted(opened, key=order), sorted(closed, key=order)


def link(console_url: str | None, invocation_id: str) -> str | None:
    return f"{console_url.rstrip('/')}/#invocation={invocation_id}" if console_url else None


def pending_notice(row: Mapping[str, Any], console_url: str | None = None) -> Notice:
    """``approval.pending``: everything an approver needs to decide, and what it binds."""
    data = {
        "invocation_id": row["invocation_id"],
        "tenant": row["tenant"],
        "tool": row["tool"],
        "actor": row["actor"],
        "target": row["target"],
        "args": row.get("args"),
        "dry_run": row.get("dry_run"),
        "confirmation": row.get("confirmation"),
        "approver_roles": list(row.get("approver_roles") or ()),
        "binds": {
            "tenant": row["tenant"],
            "actor": row["actor"],
            "tool": row["tool"],
            "target": row["target"],
            "policy_version": row.get("policy_version"),
            "args_hash": row.get("args_hash"),
            "dry_run_hash": row.get("dry_run_hash"),
        },
        "requested_at": row.get("requested_at"),
        "expires_at": row.get("expires_at"),
        "console_url": link(console_url, row["invocation_id"]),
    }
    return Notice(PENDING, row["invocation_id"], row["tenant"], data)


def decided_notice(
    row: Mapping[str, Any], status: Mapping[str, Any] | None, console_url: str | None = None
) -> Notice:
    """``approval.decided``: how the pending item ended (granted, denied, expired)."""
    approval = (status or {}).get("approval") or {}
    data = {
        "invocation_id": row["invocation_id"],
        "tenant": row["tenant"],
        "tool": row["tool"],
        "actor": row["actor"],
        "target": row["target"],
        "decision": approval.get("state") or "decided",
        "approver": approval.get("approver"),
        "reason": approval.get("reason") or None,
        "approval_id": approval.get("approval_id"),
        "console_url": link(console_url, row["invocation_id"]),
    }
    return Notice(DECIDED, row["invocation_id"], row["tenant"], data)


# --- Slack Block Kit ----------------------------------------------------------------------


def _code(value: Any) -> str:
    text = json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False)
    if len(text) > MAX_SLACK_TEXT:
        text = text[: MAX_SLACK_TEXT - 1] + "…"
    return f"```{text}```"


def _when(ms: Any) -> str:
    if not isinstance(ms, int):
        return "—"
    iso = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return iso.replace("+00:00", "Z")


def _mrkdwn(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text}


def slack_pending(notice: Notice) -> tuple[str, list[dict[str, Any]]]:
    """The fallback text and the blocks of the interactive message for a pending item."""
    d = notice.data
    binds = d["binds"]
    inv = notice.invocation_id
    text = f"{d['tool']} on {d['target']} by {d['actor']} needs approval"
    fields = [
        _mrkdwn(f"*Tool*\n{d['tool']}"),
        _mrkdwn(f"*Actor*\n{d['actor']} @ {d['tenant']}"),
        _mrkdwn(f"*Target*\n{d['target']}"),
        _mrkdwn(f"*Decide before*\n{_when(d['expires_at'])}"),
    ]
    bound = (
        f"tenant `{binds['tenant']}`, actor `{binds['actor']}`, tool `{binds['tool']}`, "
        f"target `{binds['target']}`\npolicy version `{binds['policy_version']}`\n"
        f"arguments hash `{binds['args_hash']}`\ndry-run hash `{binds['dry_run_hash']}`"
    )
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": "Approval needed"}},
        {"type": "section", "text": _mrkdwn(f"*{text}*"), "fields": fields},
        {"type": "section", "text": _mrkdwn("*Arguments*\n" + _code(d["args"]))},
        {"type": "section", "text": _mrkdwn("*Dry run*\n" + _code(d["dry_run"]))},
        {"type": "section", "text": _mrkdwn("*The approval binds*\n" + bound)},
        {
            "type": "actions",
            "block_id": f"callgate:{inv}",
            "elements": [
                {
                    "type": "button",
                    "action_id": APPROVE_ACTION,
                    "style": "primary",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "value": inv,
                },
                {
                    "type": "button",
                    "action_id": DENY_ACTION,
                    "style": "danger",
                    "text": {"type": "plain_text", "text": "Deny"},
                    "value": inv,
                },
            ],
        },
        {"type": "context", "elements": [_mrkdwn(f"invocation `{inv}`")]},
    ]
    if d.get("console_url"):
        blocks[-1]["elements"].append(_mrkdwn(f"<{d['console_url']}|Open in the console>"))
    return text, blocks


def slack_decided(notice: Notice) -> tuple[str, list[dict[str, Any]]]:
    """The message a pending item's Slack message becomes once it is decided."""
    d = notice.data
    who = f" by {d['approver']}" if d.get("approver") else ""
    why = f": {d['reason']}" if d.get("reason") else ""
    text = f"{d['tool']} on {d['target']} by {d['actor']}: {d['decision']}{who}{why}"
    return text, [{"type": "section", "text": _mrkdwn(text)}]


@dataclass(frozen=True)
class SlackAction:
    """The one button click of a Slack ``block_actions`` interaction callgate acts on."""

    slack_user: str
    team: str | None
    decision: Literal["grant", "deny"]
    invocation_id: str


def slack_action(payload: Mapping[str, Any]) -> SlackAction | None:
    """The Approve or Deny click in an interaction payload, or None (anything else)."""
    if payload.get("type") != "block_actions":
        return None
    user = payload.get("user")
    actions = payload.get("actions")
    if not isinstance(user, Mapping) or not isinstance(actions, Sequence) or len(actions) != 1:
        return None
    action = actions[0]
    if not isinstance(action, Mapping):
        return None
    decision = {APPROVE_ACTION: "grant", DENY_ACTION: "deny"}.get(str(action.get("action_id")))
    slack_user, value = user.get("id"), action.get("value")
    if decision is None or not isinstance(slack_user, str) or not isinstance(value, str):
        return None
    team = payload.get("team")
    team_id = team.get("id") if isinstance(team, Mapping) else None
    return SlackAction(
        slack_user,
        team_id if isinstance(team_id, str) else None,
        "grant" if decision == "grant" else "deny",
        value,
    )


def wanted(notice: Notice, events: frozenset[str], tenants: frozenset[str]) -> bool:
    """Whether a receiver subscribed to ``events`` of ``tenants`` (empty: all) gets it.
    Tenants compare exactly: a receiver never gets another tenant's items by a spelling."""
    return notice.kind in events and (not tenants or notice.tenant in tenants)


def retry_due(attempt: int, delays_s: Sequence[float]) -> float | None:
    """Seconds before retry number ``attempt`` (1-based) of a failed delivery, or None
    when the attempts are spent (then it is a dead letter)."""
    return float(delays_s[attempt - 1]) if 1 <= attempt <= len(delays_s) else None
