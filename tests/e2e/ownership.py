"""The created-resource ownership scenario (C7, ADR 0014), run on both backends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Session = Callable[[str, str, str], str]  # user, tenant, roles -> token
Propose = Callable[[str, str, dict[str, Any], str | None], dict[str, Any]]


def created_ticket_ownership(session: Session, propose: Propose, key: str) -> None:
    """A ticket ``tickets.create`` made (``TKT-…``) is readable by its creator; a session
    of another tenant gets ``tool_forbidden``; a ticket nobody created is denied with a
    message saying nobody owns it."""
    alice = session("alice", "acme", "support")
    gina = session("gina", "globex", "support")
    created = propose(alice, "tickets.create", {"title": "own", "requester_id": "alice"}, key)
    assert created["outcome"] == "executed", created
    ticket_id = created["result"]["ticket_id"]
    assert ticket_id.startswith("TKT-")

    mine = propose(alice, "tickets.read", {"ticket_id": ticket_id}, None)
    assert mine["outcome"] == "executed", mine
    assert mine["result"]["title"] == "own"
    theirs = propose(gina, "tickets.read", {"ticket_id": ticket_id}, None)
    assert theirs["outcome"] == "tool_forbidden", theirs
    assert "result" not in theirs
    nobody = propose(alice, "tickets.read", {"ticket_id": "TKT-000000000000"}, None)
    assert nobody["outcome"] == "tool_forbidden", nobody
    assert "owned by no tenant" in nobody["error"]["message"], nobody
