"""Pending-approval view (C5): what an approval UI shows a human and asks them to confirm.

View ``pending``, key ``invocation_id``. ``ApprovalRequested`` puts the record in, with
everything the approval will bind (C4, C11: tenant, actor, tool, target, policy version,
``args_hash``, ``dry_run_hash``, partition key, invocation), the arguments and the dry-run
snapshot the human confirms (C5; a tool's sensitive fields as digests, ADR 0035), who may
confirm (``confirmation``, ``approver_roles``, ``allow_self_approval``) and ``expires_at``,
so a UI shows exactly what is being approved. With a quorum (ADR 0030) the record also
holds ``approvals_required`` and ``grants`` (who granted so far, in order); each
``ApprovalGrantRecorded`` rewrites it. ``ApprovalGranted`` (the quorum met),
``ApprovalDenied`` and ``ApprovalExpired(stage="pending")`` take it
out again with a tombstone (``value=None``), so a compacted topic keeps only what is still
pending. Every record and tombstone names its tenant (``ViewRecord.tenant``: the Kafka
``cg-tenant`` header), so one tenant's approval UI keeps only its own items.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from callgate.domain.canonical import canonical_json
from callgate.domain.events import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalGrantRecorded,
    ApprovalRequested,
    Event,
)
from callgate.domain.redaction import NO_REDACTION, Redactor
from callgate_projections import Projection, ViewRecord, load_json_object, parse_json_field

VIEW = "pending"

# Per partition key: invocation id -> its current record, of the approvals still pending
# (a state stored before the records were kept holds ``{"tenant": ...}`` alone).
PendingState = Mapping[str, Mapping[str, object]]


def _value(event: ApprovalRequested, redactor: Redactor) -> dict[str, object]:
    args = parse_json_field(event.args_json, "args_json")
    dry_run = parse_json_field(event.dry_run_json, "dry_run_json")
    target: object = event.target
    if redactor.active(event.tool):  # sensitive fields: digests only (ADR 0035)
        secrets = redactor.secrets(event.tool, args)
        dry_run = redactor.scrub(event.tool, dry_run, secrets)
        target = redactor.scrub(event.tool, target, secrets)
        args = redactor.args(event.tool, args)
    return {
        "invocation_id": event.invocation_id,
        "partition_key": event.partition_key,
        "tool": event.tool,
        "tenant": event.tenant,
        "actor": event.actor,
        "target": target,
        "args": args,
        "args_hash": event.args_hash,
        "dry_run": dry_run,
        "dry_run_hash": event.dry_run_hash,
        "confirmation": event.confirmation,
        "approver_roles": list(event.approver_roles),
        "allow_self_approval": event.allow_self_approval,
        "expires_at": event.expires_at,
        "policy_version": event.policy_version,
        "requested_at": event.occurred_at,
        "approvals_required": event.approvals_required,
        "grants": [],
        "usage": parse_json_field(event.usage_json, "usage_json") if event.usage_json else None,
    }


_EMPTY: PendingState = MappingProxyType({})


def project(
    state: PendingState, event: Event, redactor: Redactor = NO_REDACTION
) -> tuple[PendingState, tuple[ViewRecord, ...]]:
    """Open a pending approval on request, record each grant towards its quorum, and
    tombstone it once it is decided or expires. The state keeps the record as emitted
    (sensitive fields already digests, ADR 0035)."""
    key = event.invocation_id
    match event:
        case ApprovalRequested():
            value = MappingProxyType(_value(event, redactor))
            opened = MappingProxyType({**state, key: value})
            return opened, (ViewRecord.of(VIEW, key, dict(value), event.tenant),)
        case ApprovalGrantRecorded():
            old = state.get(key)
            if old is None or "invocation_id" not in old:
                return state, ()  # not pending, or a record from before values were kept
            grants = [*(old.get("grants") or ()), event.approver]  # type: ignore[misc]
            value = MappingProxyType({**old, "grants": grants})
            tenant = str(old["tenant"])
            return MappingProxyType({**state, key: value}), (
                ViewRecord.of(VIEW, key, dict(value), tenant),
            )
        case ApprovalGranted() | ApprovalDenied() | ApprovalExpired(stage="pending"):
            if key in state:
                closed = MappingProxyType({k: v for k, v in state.items() if k != key})
                return closed, (ViewRecord(VIEW, key, None, str(state[key]["tenant"]) or None),)
    return state, ()


class PendingProjection(Projection[PendingState]):
    name = "pending-projection"
    views = frozenset({VIEW})
    reacts_to = frozenset(
        {ApprovalRequested, ApprovalGrantRecorded, ApprovalGranted, ApprovalDenied, ApprovalExpired}
    )

    def __init__(self, redactor: Redactor = NO_REDACTION) -> None:
        self.redactor = redactor

    def initial_state(self) -> PendingState:
        return _EMPTY

    def project(
        self, state: PendingState, event: Event
    ) -> tuple[PendingState, Sequence[ViewRecord]]:
        return project(state, event, self.redactor)

    def dump_state(self, state: PendingState) -> bytes:
        return canonical_json({"records": {k: dict(v) for k, v in state.items()}}).encode()

    def load_state(self, data: bytes) -> PendingState:
        raw = load_json_object(data)
        if "records" in raw:
            return MappingProxyType({k: MappingProxyType(v) for k, v in raw["records"].items()})
        if "tenants" in raw:  # before the records were kept: the tenant alone
            return MappingProxyType({k: {"tenant": t} for k, t in raw["tenants"].items()})
        # A state stored before tenants were kept: the ids alone (tenant unknown, "").
        return MappingProxyType({k: {"tenant": ""} for k in raw["pending"]})
