"""ARAP, the AuthZEN Access Request and Approval Profile (ADR 0090): pure mappings.

callgate's approvals are the profile's access requests: a requestable denial is an
evaluation whose outcome is ``approval_required``; an access request is that evaluation
decided again and its confirmation asked for (``ToolCallProposed.access_request``); the
task is that invocation, its status read from the status view; the approval result is
the callgate approval artifact, which a re-evaluation presents and the decider checks
like any (C4, C5, C11). This module maps callgate's vocabulary onto the profile's wire
values and back; it reads no clock and sends nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from callgate.domain.codes import Code

# The capability URN the profile asks a PDP's metadata to list.
CAPABILITY: Final = "urn:openid:authzen:capability:access-request"
# How long a requestable denial may be submitted after the evaluation was decided: the
# access request endpoint checks it against the recorded decision, not the echoed value.
REQUESTABLE_S: Final = 600
# The nonce prefix of an access request's invocation id (``domain/scope.bound_id``): the
# decider refuses an access request without it and any other proposal with it, so the
# task endpoint serves access requests only.
TASK_PREFIX: Final = "arq-"
# The profile's ``context.reason`` of a requestable denial: callgate's code, unchanged.
REQUESTABLE_REASON: Final = Code.APPROVAL_REQUIRED.value
# The profile's completion mode: the PEP evaluates again, presenting the approval.
REEVALUATE: Final = "reevaluate"

# Task statuses (the profile's "Task Status Values").
PENDING: Final = "pending"
APPROVED: Final = "approved"
DENIED: Final = "denied"
EXPIRED: Final = "expired"
FAILED: Final = "failed"
TERMINAL_STATUSES: Final = frozenset({APPROVED, DENIED, EXPIRED, FAILED})
# Callback event names callgate sends (``cancelled`` and ``partial`` never happen here:
# no PEP cancellation, no bulk requests).
CALLBACK_EVENTS: Final = frozenset({APPROVED, DENIED, EXPIRED, "cancelled", FAILED, "partial"})

# The profile's problem types (its "Error Responses"), with their HTTP statuses.
PROBLEM = "urn:openid:authzen:access-request:error:"
NOT_REQUESTABLE: Final = (PROBLEM + "not_requestable", 400)
EXPIRED_DENIAL: Final = (PROBLEM + "expired_denial", 410)
INVALID_DENIAL_BINDING: Final = (PROBLEM + "invalid_denial_binding", 400)
UNKNOWN_TASK: Final = (PROBLEM + "unknown_task", 404)

# A re-evaluation that presented an approval and was refused: the profile's reason and
# next action for callgate's code ("Re-evaluation Denial Reason" registry).
_REEVALUATION: Mapping[str, tuple[str, str]] = {
    Code.APPROVAL_EXPIRED.value: ("approval_expired", "request"),
    Code.APPROVAL_CONSUMED.value: ("approval_expired", "request"),  # superseded: used
    Code.APPROVAL_MISMATCH.value: ("out_of_scope", "request"),
    Code.APPROVAL_MISSING.value: ("approval_unverifiable", "none"),
    Code.TOOL_FORBIDDEN.value: ("policy_denied", "none"),
}


def reevaluation_denial(outcome: str) -> tuple[str, str]:
    """``(reason, next_action)`` of a re-evaluation refused with ``outcome``; anything not
    in the registry's terms is ``policy_denied`` with nothing to do (fail closed)."""
    return _REEVALUATION.get(outcome, ("policy_denied", "none"))


def task_status(status: Mapping[str, Any]) -> str:
    """The task status of an access request from its status view record.

    ``pending`` while the approval is asked for (or its dry-run runs); ``approved`` once an
    artifact was issued (it stays so: a task changes status once; the approval's own
    expiry is ``approved_until``); ``denied`` (an approver's denial or the actor's
    withdrawal), ``expired`` (nobody decided in time); ``failed`` when the request was
    refused or failed before an approval was asked for (a freeze, a failed dry-run)."""
    approval = status.get("approval") or {}
    if approval.get("approval_id"):
        return APPROVED
    state = approval.get("state")
    if state == "denied":
        return DENIED
    if state == "expired":
        return EXPIRED
    if state == "pending":
        return PENDING
    return PENDING if status.get("outcome") == Code.APPROVAL_REQUIRED.value else FAILED


def approval_result(status: Mapping[str, Any], jti: str) -> dict[str, Any] | None:
    """The profile's completion result of an approved task: ``reevaluate`` with the
    ``approval`` to present at ``context.approval`` (``state`` is callgate's signed
    artifact, verified by the decider; ``id`` its ``jti``)."""
    approval = status.get("approval") or {}
    artifact = approval.get("approval_id")
    if not artifact:
        return None
    out: dict[str, Any] = {"id": jti, "state": artifact}
    if isinstance(approval.get("expires_at"), int):
        out["approved_until"] = rfc3339(approval["expires_at"])
    return {"mode": REEVALUATE, "approval": out}


def rfc3339(epoch_ms: int) -> str:
    """An RFC 3339 UTC time, as the profile writes its timestamps."""
    stamp = datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")
    return stamp.replace("+00:00", "Z")


def parse_rfc3339(value: str) -> int | None:
    """Epoch milliseconds of an RFC 3339 time with an offset, or None."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return int(parsed.timestamp() * 1000)
