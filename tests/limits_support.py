"""Limits shared by the usage-limit tests of both backends (ADR 0079)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.harness import write_profile

REFUND_LIMIT: dict[str, Any] = {
    "name": "refunds-per-actor",
    "tools": ["refunds.issue"],
    "count": "sum",
    "arg": "amount_cents",
    "max": 100_000,
    "window": "24h",
    "per": ["actor"],
}
TICKET_LIMIT: dict[str, Any] = {
    "name": "tickets-per-actor",
    "tools": ["tickets.create"],
    "max": 50,
    "window": "1h",
    "per": ["actor"],
}


def limited_profile(directory: Path, *limits: dict[str, Any], policy: str = "") -> Path:
    """The default profile with refunds below the approval threshold confirmed by no one
    (high impact still needs an approver), continuing on approval, and ``limits``."""

    def edit(tools: dict[str, Any]) -> None:
        tools["refunds.issue"]["confirmation"] = "none"

    path = write_profile(directory, edit, policy_suffix=policy, continuation=True)
    raw = yaml.safe_load(path.read_text())
    raw["limits"] = list(limits)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def refund(i: int) -> dict[str, Any]:
    """A refund of 9,999 cents: below the approval threshold, ten fit in 100,000."""
    return {"order_id": f"ORD-{i}", "amount_cents": 9_999, "currency": "EUR"}
