"""The events clients write to the ``requests`` topic (agent platforms, approval UIs).

They carry the bearer session token, so ``requests`` has a bounded retention
(``requests_retention_ms``); what the decider records on ``events`` is the verified
principal and ``session_digest``, never the token (ADR 0016).
"""

from __future__ import annotations

from typing import ClassVar

from callgate.domain.events.envelope import Event, event_class


@event_class
class ToolCallProposed(Event):
    """A model proposed a tool call; the agent platform publishes it with the session token."""

    TOPIC: ClassVar[str] = "requests"
    session_token: str
    tool: str
    args_json: str
    idempotency_key: str | None = None
    approval_id: str | None = None
    # An evaluation only (AuthZEN, ADR 0083): decided like any call, never run.
    evaluate_only: bool = False
    # An ARAP access request (ADR 0090), with ``evaluate_only``: an evaluation that, when
    # it needs a confirmation, asks for it like a call (approvers, quorum, dry-run); never run.
    access_request: bool = False


# ``ApprovalDecisionSubmitted.decision`` of the actor withdrawing their own pending call
# (MCP ``tasks/cancel``, ADR 0086): recorded as ``ApprovalDenied`` with the actor as approver.
WITHDRAW = "withdraw"


@event_class
class ApprovalDecisionSubmitted(Event):
    """A human decided on a pending approval; identity comes from ``session_token``."""

    TOPIC: ClassVar[str] = "requests"
    session_token: str
    decision: str  # "grant" | "deny" | WITHDRAW (the actor's own, ADR 0086)
    reason: str = ""
