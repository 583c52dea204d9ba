"""Invocation status view (CLI ``status``/``propose``): what became of each invocation.

View ``status``, key ``invocation_id``, one record per change a caller would see. The
value: ``invocation_id``, ``partition_key``, ``tool``, ``actor``, ``tenant``, ``target``
(``None`` while unknown, e.g. before authentication), ``outcome`` (always a ``Code``:
``allowed`` while a permitted call is in progress, then a terminal code), ``settled``
(outcome in ``TERMINAL``), ``error`` ``{code, message, details}`` when the outcome came
from a rejection or a failure, ``result`` (parsed JSON) once executed or replayed,
``dry_run`` (the snapshot), ``approval`` (the approval requested *for* this invocation:
``state`` pending/granted/denied/expired, ``approval_id`` once granted, ``approver``,
``reason``, ``expires_at``), ``quorum`` (ADR 0030: ``required`` and ``grants``, who
granted so far; ``None`` for a single approver), ``approved_by`` (the approval this
invocation *presented*, C4/C11), ``replay_of`` (C8) and ``updated_at`` (``occurred_at``
of the last change).
A record names its tenant once known (``ViewRecord.tenant``, the ``cg-tenant`` header).
A tool's sensitive argument values appear in no field, only their digests (ADR 0035).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from callgate.domain.canonical import canonical_json
from callgate.domain.codes import TERMINAL, Code, Rejection, evaluation_outcome, failure_code
from callgate.domain.events import (
    ApprovalDecisionRejected,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalGrantRecorded,
    ApprovalRequested,
    ConfirmationAccepted,
    DryRunFailed,
    DryRunRecorded,
    DryRunRequested,
    Event,
    ExecutionFailed,
    ExecutionReconciled,
    ExecutionRequested,
    ExecutionStarted,
    ExecutionSucceeded,
    ExecutionUncertain,
    PolicyDecided,
    ProposalRejected,
    ReconciliationRequested,
    ReplayServed,
)
from callgate.domain.redaction import NO_REDACTION, Redactor
from callgate_projections import (
    EVENTS_TOPIC,
    LOG_EVENTS,
    USAGE_EVENTS,
    Projection,
    ViewRecord,
    load_json_object,
    materialize,
    parse_json_field,
)

VIEW = "status"

_APPROVAL_STAGES = frozenset({"pending", "granted"})


def _forbidden_message(event: PolicyDecided) -> str:
    """Why the ACL denied; a resource nobody owns says so (C7, fail closed)."""
    denied = f"policy {event.policy_version} does not permit {event.tool}"
    if event.resource_json is None:
        return denied
    facts = parse_json_field(event.resource_json, "resource_json")
    if not isinstance(facts, dict) or facts.get("tenant") is not None:
        return denied
    source = str(facts.get("source", ""))
    where = (
        f"provider {source.removeprefix('provider:')!r} does not know an owner"
        if source.startswith("provider:")
        else "the profile names no owner"
    )
    reason = f": {facts['message']}" if facts.get("message") else ""
    return (
        f"resource {event.target!r} is owned by no tenant ({where}{reason}); denied (fail closed)"
    )


def as_code(value: str) -> Code:
    """A code from the log; an unknown spelling is a corrupt log (fail closed)."""
    try:
        return Code(value)
    except ValueError as exc:
        raise Rejection(Code.MALFORMED_EVENT, f"unknown code {value!r}", {"code": value}) from exc


def outcome_for(event: Event) -> Code | None:
    """The outcome ``event`` moves its invocation to, or ``None`` when it does not change it.

    Shared by the status and audit views so both read one mapping (C9, C12).
    """
    match event:
        case ProposalRejected():
            return as_code(event.code)
        case PolicyDecided(decision="permit" | "deny", evaluate_only=True):
            return evaluation_outcome(event.decision == "permit", event.confirmation)
        case PolicyDecided(decision="permit"):
            return Code.ALLOWED
        case PolicyDecided(decision="deny"):
            return Code.TOOL_FORBIDDEN  # C12: denial never reaches a provider
        case PolicyDecided():
            raise Rejection(Code.MALFORMED_EVENT, f"unknown policy decision {event.decision!r}")
        case ApprovalRequested():
            return Code.APPROVAL_REQUIRED
        case ConfirmationAccepted(evaluate_only=True):
            return Code.PERMITTED  # ADR 0090: a re-evaluation an approval confirmed
        case ExecutionRequested():
            return Code.ALLOWED  # in progress again, e.g. a retry after reconciliation (C12)
        case ReplayServed():
            return Code.REPLAYED
        case ExecutionSucceeded():
            return Code.EXECUTED
        case ExecutionFailed() | DryRunFailed():
            return failure_code(event.code)
        case ExecutionUncertain():
            return Code.OUTCOME_UNCERTAIN
        case ExecutionReconciled(found=True):
            return Code.EXECUTED
        case ApprovalExpired() if event.stage not in _APPROVAL_STAGES:
            raise Rejection(Code.MALFORMED_EVENT, f"unknown approval stage {event.stage!r}")
    return None


@dataclass(frozen=True, slots=True)
class StatusState:
    """Per partition key: the current status value of each of its invocations."""

    invocations: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )


def subject_of(event: Event) -> str:
    """The invocation an event tells about: its own, except for a reconciliation.

    ``ExecutionReconciled`` is emitted on the invocation that asked (often a later call
    with the same idempotency key, which then gets ``ReplayServed`` or a new
    ``ExecutionRequested``) but states what became of the original execution (C12).
    """
    if isinstance(event, ExecutionReconciled) and event.original_invocation_id:
        return event.original_invocation_id
    return event.invocation_id


def _blank(invocation_id: str, partition_key: str) -> dict[str, Any]:
    return {
        "invocation_id": invocation_id,
        "partition_key": partition_key,
        "tool": None,
        "actor": None,
        "tenant": None,
        "target": None,
        "outcome": None,
        "settled": False,
        "error": None,
        "result": None,
        "dry_run": None,
        "approval": None,
        "approved_by": None,
        "replay_of": None,
        "quorum": None,
        "updated_at": 0,
    }


def _known(value: dict[str, Any], **fields: str) -> None:
    """Record identity fields the event knows (empty strings mean "not known")."""
    for name, given in fields.items():
        if given:
            value[name] = given


def _approval(value: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    base = value["approval"] or {
        "state": None,
        "approval_id": None,
        "approver": None,
        "reason": None,
        "expires_at": None,
    }
    return {**base, **changes}


def upstream_error(event: ExecutionFailed) -> dict[str, Any]:
    """The upstream's JSON-RPC error an execution failed with, as JSON-RPC writes one:
    ``code``, ``message`` and ``data`` when it sent data (and callgate kept it)."""
    error: dict[str, Any] = {"code": event.upstream_code, "message": event.upstream_message}
    if event.upstream_data_json:
        error["data"] = parse_json_field(event.upstream_data_json, "upstream_data_json")
    return error


def _error(code: Code, message: str, details: Any = None) -> dict[str, Any]:
    return {"code": code.value, "message": message, "details": {} if details is None else details}


def _evolve(old: Mapping[str, Any], event: Event) -> dict[str, Any]:
    """The status value after ``event``; never mutates ``old`` (state is shared).

    An event that sets the outcome also sets ``error``: its own for rejections and
    failures, ``None`` otherwise (a reconciled or retried call is no longer failing).
    """
    value = dict(old)
    outcome = outcome_for(event)
    error: dict[str, Any] | None = None
    match event:
        case ProposalRejected():
            _known(value, tool=event.tool, actor=event.actor, tenant=event.tenant)
            details = parse_json_field(event.details_json, "details_json")
            error = _error(as_code(event.code), event.message, details)
        case PolicyDecided():
            _known(value, tool=event.tool, actor=event.actor, tenant=event.tenant)
            _known(value, target=event.target)
            if outcome is Code.TOOL_FORBIDDEN:
                message = _forbidden_message(event)
                error = _error(outcome, message)
        case ApprovalRequested():
            _known(value, tool=event.tool, actor=event.actor, tenant=event.tenant)
            _known(value, target=event.target)
            value["dry_run"] = parse_json_field(event.dry_run_json, "dry_run_json")
            value["approval"] = _approval(value, state="pending", expires_at=event.expires_at)
            if event.approvals_required > 1:  # a quorum (ADR 0030): who granted so far
                value["quorum"] = {"required": event.approvals_required, "grants": []}
        case ApprovalGrantRecorded():
            grants = [*((value["quorum"] or {}).get("grants") or []), event.approver]
            value["quorum"] = {"required": event.required, "grants": grants}
        case ApprovalGranted():
            value["approval"] = _approval(
                value,
                state="granted",
                approval_id=event.approval_id,
                approver=event.approver,
                expires_at=event.expires_at,
            )
        case ApprovalDenied():
            value["approval"] = _approval(
                value, state="denied", approver=event.approver, reason=event.reason
            )
        case ApprovalExpired():
            value["approval"] = _approval(value, state="expired")
        case ConfirmationAccepted():
            value["approved_by"] = {
                "approval_jti": event.approval_jti,
                "approver": event.approver,
                "approved_invocation_id": event.approved_invocation_id,
            }
        case DryRunRequested() | ExecutionRequested() | ReconciliationRequested():
            _known(value, tenant=event.tenant, tool=event.tool, target=event.target)
        case DryRunRecorded():
            value["dry_run"] = parse_json_field(event.snapshot_json, "snapshot_json")
        case ExecutionFailed() if event.upstream_code is not None:
            details = {"upstream_error": upstream_error(event)}
            error = _error(failure_code(event.code), event.message, details)
        case ExecutionFailed() | DryRunFailed():
            code = failure_code(event.code)
            error = _error(code, event.message)
        case ExecutionUncertain():
            error = _error(Code.OUTCOME_UNCERTAIN, event.reason)
        case ExecutionSucceeded() | ExecutionReconciled(found=True):
            value["result"] = parse_json_field(event.result_json, "result_json")
        case ReplayServed():
            value["result"] = parse_json_field(event.result_json, "result_json")
            value["replay_of"] = {
                "invocation_id": event.original_invocation_id,
                "outcome": as_code(event.original_outcome).value,
            }
    if outcome is not None:
        value["outcome"] = outcome.value
        value["settled"] = outcome in TERMINAL
        value["error"] = error
    return value


def _content(value: Mapping[str, Any]) -> str:
    return canonical_json({k: v for k, v in value.items() if k != "updated_at"})


# Leaves whose canonical texts are equal exactly when they are the same type and ``==``.
_LEAVES = frozenset({str, int, bool, type(None)})


def _same_content(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """``_content(new) == _content(old)``, without encoding the fields ``_evolve`` kept.

    Canonical JSON writes an object as its sorted keys with self-delimiting values, so two
    values with the same keys have equal texts exactly when every field's text is equal.
    A field ``_evolve`` copied is the same object (equal text); two ``str``/``int``/
    ``bool``/``None`` leaves have equal texts exactly when they are the same type and equal
    (``True == 1`` in Python, not in JSON); anything else is compared by its canonical text,
    so a changed value that canonical JSON refuses still raises here.
    """
    if new.keys() != old.keys():
        return _content(new) == _content(old)
    same = True
    for name, mine in new.items():
        theirs = old[name]
        if mine is theirs or name == "updated_at":
            continue
        kind = type(mine)
        if kind in _LEAVES and type(theirs) in _LEAVES:
            same = same and kind is type(theirs) and mine == theirs
        elif canonical_json(mine) != canonical_json(theirs):
            same = False
    return same


def project(
    state: StatusState, event: Event, redactor: Redactor = NO_REDACTION
) -> tuple[StatusState, tuple[ViewRecord, ...]]:
    """Fold one ``events``-topic event; emit the invocation's status when it changed.

    No record is emitted before an invocation has an outcome (its first event on the
    log, ``PolicyDecided`` or ``ProposalRejected``, always gives one).
    """
    if type(event).TOPIC != EVENTS_TOPIC:
        return state, ()
    inv = subject_of(event)
    old = state.invocations.get(inv) or _blank(inv, event.partition_key)
    new = _evolve(old, event)
    tool = new["tool"]
    if redactor.active(tool) and isinstance(event, _WITH_ARGS):
        _keep_secrets(new, redactor.secrets(tool, parse_json_field(event.args_json, "args_json")))
    if _same_content(new, old):
        return state, ()
    new["updated_at"] = event.occurred_at
    invocations = {**state.invocations, inv: new}
    if new["outcome"] is None:
        return StatusState(MappingProxyType(invocations)), ()
    shown = _redacted(new, redactor) if SECRETS in new or redactor.active(tool) else new
    records = (ViewRecord.of(VIEW, inv, shown, new["tenant"]),)
    return StatusState(MappingProxyType(invocations)), records


# Sensitive fields (ADR 0035): the values of an invocation's sensitive arguments, kept in
# the projection's state (never in the view) to find them in its later dry-run, result and
# messages, which arrive in events without the arguments.
SECRETS = "_secrets"
_WITH_ARGS = (
    PolicyDecided,
    DryRunRequested,
    ApprovalRequested,
    ExecutionRequested,
    ReconciliationRequested,
)
_SCRUBBED = ("target", "error", "result", "dry_run")


def _keep_secrets(value: dict[str, Any], found: Sequence[Any]) -> None:
    known = list(value.get(SECRETS) or [])
    value[SECRETS] = known + [s for s in found if s not in known]


def _redacted(value: Mapping[str, Any], redactor: Redactor) -> dict[str, Any]:
    """The view's value: without the kept secrets, with digests in their place."""
    shown = {k: v for k, v in value.items() if k != SECRETS}
    secrets = value.get(SECRETS) or []
    for name in _SCRUBBED:
        shown[name] = redactor.scrub(value["tool"], shown[name], secrets)
    return shown


class StatusProjection(Projection[StatusState]):
    name = "status-projection"
    views = frozenset({VIEW})
    # No status change: ``_evolve`` has no case for these and ``outcome_for`` gives None.
    reacts_to = LOG_EVENTS - {ApprovalDecisionRejected, ExecutionStarted} - USAGE_EVENTS

    def __init__(self, redactor: Redactor = NO_REDACTION) -> None:
        self.redactor = redactor

    def initial_state(self) -> StatusState:
        return StatusState()

    def project(self, state: StatusState, event: Event) -> tuple[StatusState, Sequence[ViewRecord]]:
        return project(state, event, self.redactor)

    def dump_state(self, state: StatusState) -> bytes:
        return canonical_json({"invocations": dict(state.invocations)}).encode()

    def load_state(self, data: bytes) -> StatusState:
        return StatusState(MappingProxyType(load_json_object(data)["invocations"]))


def status_of(records: Iterable[ViewRecord], invocation_id: str) -> dict[str, Any] | None:
    """The current status of ``invocation_id`` in a stream of view records (or ``None``)."""
    return materialize(records, VIEW).get(invocation_id)
