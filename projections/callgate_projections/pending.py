"""Pending-approval view (C5): what an approval UI shows a human and asks them to confirm.

View ``pending``, key ``invocation_id``. ``ApprovalRequested`` puts the record in: the
arguments and the dry-run snapshot the human confirms (C5), who may confirm
(``confirmation``, ``approver_roles``), ``expires_at``, and the ``policy_version``,
``args_hash`` and ``dry_run_hash`` the approval will be bound to (C11).
``ApprovalGranted``, ``ApprovalDenied`` and ``ApprovalExpired(stage="pending")`` take it
out again with a tombstone (``value=None``), so a compacted topic keeps only what is
still pending.
"""

from __future__ import annotations

from collections.abc import Sequence

from callgate.domain.canonical import canonical_json
from callgate.domain.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    Event,
)
from callgate_projections import Projection, ViewRecord, load_json_object, parse_json_field

VIEW = "pending"

# Per partition key: the invocation ids whose approval is pending.
PendingState = frozenset[str]


def _value(event: ApprovalRequested) -> dict[str, object]:
    return {
        "invocation_id": event.invocation_id,
        "partition_key": event.partition_key,
        "tool": event.tool,
        "tenant": event.tenant,
        "actor": event.actor,
        "target": event.target,
        "args": parse_json_field(event.args_json, "args_json"),
        "args_hash": event.args_hash,
        "dry_run": parse_json_field(event.dry_run_json, "dry_run_json"),
        "dry_run_hash": event.dry_run_hash,
        "confirmation": event.confirmation,
        "approver_roles": list(event.approver_roles),
        "expires_at": event.expires_at,
        "policy_version": event.policy_version,
        "requested_at": event.occurred_at,
    }


def project(state: PendingState, event: Event) -> tuple[PendingState, tuple[ViewRecord, ...]]:
    """Open a pending approval on request; tombstone it once it is decided or expires."""
    key = event.invocation_id
    match event:
        case ApprovalRequested():
            return state | {key}, (ViewRecord.of(VIEW, key, _value(event)),)
        case ApprovalGranted() | ApprovalDenied() | ApprovalExpired(stage="pending"):
            if key in state:
                return state - {key}, (ViewRecord(VIEW, key, None),)
    return state, ()


class PendingProjection(Projection[PendingState]):
    name = "pending-projection"
    views = frozenset({VIEW})
    reacts_to = frozenset({ApprovalRequested, ApprovalGranted, ApprovalDenied, ApprovalExpired})

    def initial_state(self) -> PendingState:
        return frozenset()

    def project(
        self, state: PendingState, event: Event
    ) -> tuple[PendingState, Sequence[ViewRecord]]:
        return project(state, event)

    def dump_state(self, state: PendingState) -> bytes:
        return canonical_json({"pending": sorted(state)}).encode()

    def load_state(self, data: bytes) -> PendingState:
        return frozenset(load_json_object(data)["pending"])
