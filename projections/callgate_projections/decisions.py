"""Approval-decision view: the answer to one submitted approve/deny.

View ``decisions``, key = the ``ApprovalDecisionSubmitted`` event id (the decider's
follow-on events carry it as ``causation_id``). An approval UI or the CLI that
published a decision reads its answer here: the signed ``approval_id`` when granted,
``recorded`` with ``granted`` of ``required`` for a grant towards a quorum (ADR 0030),
``denied``, or the coded refusal (``approver_forbidden``, ``not_pending``,
``unauthenticated``, ``approval_expired``). Stateless: each record depends on one event.
Every value has every field (``None`` where the decision has none), as its Avro schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from callgate.domain.events import (
    ApprovalDecisionRejected,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalGrantRecorded,
    Event,
)
from callgate_projections import Projection, ViewRecord

VIEW = "decisions"

DecisionsState = None


def project(state: None, event: Event) -> tuple[None, tuple[ViewRecord, ...]]:
    value: dict[str, Any] = {
        "invocation_id": event.invocation_id,
        "decided_at": event.occurred_at,
        "approval_id": None,
        "approval_jti": None,
        "approver": None,
        "expires_at": None,
        "reason": None,
        "error": None,
        "granted": None,
        "required": None,
    }
    match event:
        case ApprovalGranted():
            value.update(
                decision="granted",
                approval_id=event.approval_id,
                approval_jti=event.approval_jti,
                approver=event.approver,
                expires_at=event.expires_at,
            )
            if event.approvers:
                value.update(granted=len(event.approvers), required=len(event.approvers))
        case ApprovalGrantRecorded():
            # A grant towards a quorum (ADR 0030); the grant that meets it is answered by
            # the ApprovalGranted that follows it under the same key.
            value.update(
                decision="recorded",
                approver=event.approver,
                granted=event.granted,
                required=event.required,
            )
        case ApprovalDenied():
            value.update(decision="denied", approver=event.approver, reason=event.reason)
        case ApprovalDecisionRejected():
            value.update(decision="rejected", error={"code": event.code, "message": event.message})
        case _:
            return state, ()
    return state, (ViewRecord.of(VIEW, event.causation_id, value),)


class DecisionsProjection(Projection[None]):
    name = "decisions-projection"
    views = frozenset({VIEW})
    reacts_to = frozenset(
        {ApprovalGranted, ApprovalGrantRecorded, ApprovalDenied, ApprovalDecisionRejected}
    )

    def initial_state(self) -> None:
        return None

    def project(self, state: None, event: Event) -> tuple[None, Sequence[ViewRecord]]:
        return project(state, event)

    def dump_state(self, state: None) -> bytes:
        return b"null"

    def load_state(self, data: bytes) -> None:
        return None
