"""Audit trail (C9): one hash-chained record per settled outcome of every invocation.

View ``audit``, key ``audit_key(partition_key, seq)``. A record is appended when an
invocation reaches a terminal outcome, and again (``revision`` 2, 3, ...) whenever what
the record says changes later: ``outcome_uncertain`` reconciled to ``executed`` (C12), an
approval that was requested being granted, denied or expiring. Each record stores
``proposed_by: "model"`` and ``authorized_by``: the policy decision on the session
principal, the policy version and determining policies, and the approval the call
presented (C4, C9, C11). ``decision`` is ``"none"`` when the proposal was rejected before
policy ran (e.g. ``unauthenticated``).

Chain: the records of one partition key form a chain. Record ``seq`` n (from 1) carries
``prev_hash`` (the hash of record n-1, ``GENESIS`` for the first) and
``hash = sha256(prev_hash + canonical_json(record without "hash"))``. ``verify_chain``
detects a changed, inserted, reordered or removed record; removal *from the end* leaves a
shorter valid chain, so it is only visible against the chain's head (``seq`` and last
``hash``). The projection keeps the head in its state and also emits it to view
``audit_head`` (key ``partition_key``); ``verify_chain(records, heads)`` compares. The
strongest check compares against heads rebuilt from the authoritative ``events`` log
(``fold_log`` / ``callgate replay``), since a head stored next to the records can be
truncated together with them.

Both views name the tenant of the record's principal (``ViewRecord.tenant``, the
``cg-tenant`` header), when known; an ``audit_head`` record names the tenant of the record
that moved the head.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from callgate.domain.canonical import canonical_json, is_plain, plain_json, sha256_hex
from callgate.domain.codes import TERMINAL
from callgate.domain.events import (
    ApprovalDecisionRejected,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalGrantRecorded,
    ApprovalRequested,
    ConfirmationAccepted,
    DryRunRecorded,
    DryRunRequested,
    Event,
    ExecutionFailed,
    ExecutionStarted,
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
    parse_json_field,
)
from callgate_projections.status import outcome_for, subject_of

VIEW = "audit"
HEAD_VIEW = "audit_head"
GENESIS = "0" * 64


def audit_key(partition_key: str, seq: int) -> str:
    """Record key; zero-padded so that key order is chain order within a partition key."""
    return f"{partition_key}:{seq:012d}"


def record_hash(record: Mapping[str, Any]) -> str:
    """``sha256(prev_hash + canonical JSON of the record without its hash)``."""
    return sha256_hex(str(record.get("prev_hash")) + canonical_json(_hashed(record)))


@dataclass(frozen=True, slots=True)
class AuditState:
    """Per partition key: the chain head and, per invocation, what its record would say.

    ``invocations[id]`` holds ``facts`` (gathered from its events), ``audited`` (hash of
    the content last recorded, or ``None``) and ``revision`` (records so far).
    """

    seq: int = 0
    head_hash: str = GENESIS
    invocations: Mapping[str, Mapping[str, Any]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def head(self, partition_key: str) -> dict[str, Any]:
        """The chain head, in the shape ``verify_chain`` takes as ``heads``."""
        return {"partition_key": partition_key, "seq": self.seq, "hash": self.head_hash}


def _principal(
    user: str, tenant: str, roles: Iterable[str], agent: str, delegation: Iterable[str]
) -> dict[str, Any]:
    """Who acted: the user, and beside them the agent and the delegation chain."""
    return {
        "user": user or None,
        "tenant": tenant or None,
        "roles": list(roles),
        "agent": agent or None,
        "delegation": list(delegation),
    }


# Fields added after records were chained (issue 38.4), of ``authorized_by.principal``
# and of ``approval_request``: when at their default they are left out of the hash, so a
# record written before them, read back with the schema that has them (their default
# filled in), still verifies.
_LATER_PRINCIPAL_DEFAULTS: Mapping[str, Any] = MappingProxyType({"agent": None, "delegation": []})
_LATER_REQUEST_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {"approver_agent": None, "approver_delegation": []}
)
# Likewise of the record itself (views v4): the code of the upstream's JSON-RPC error.
_LATER_RECORD_DEFAULTS: Mapping[str, Any] = MappingProxyType({"upstream_code": None})


def _without_defaults(part: object, defaults: Mapping[str, Any]) -> object:
    """``part`` without those of ``defaults`` that are at their default (as chained)."""
    if not isinstance(part, Mapping) or not any(part.get(k) == d for k, d in defaults.items()):
        return part
    return {k: v for k, v in part.items() if not (k in defaults and v == defaults[k])}


def _hashed(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as its hash covers it: without ``hash``, and without its own, a
    principal's or an approval request's later fields at their default."""
    body = {
        k: v
        for k, v in record.items()
        if k != "hash" and not (k in _LATER_RECORD_DEFAULTS and v == _LATER_RECORD_DEFAULTS[k])
    }
    authorized = body.get("authorized_by")
    if isinstance(authorized, Mapping):
        principal = _without_defaults(authorized.get("principal"), _LATER_PRINCIPAL_DEFAULTS)
        if principal is not authorized.get("principal"):
            body["authorized_by"] = {**authorized, "principal": principal}
    if "approval_request" in body:
        body["approval_request"] = _without_defaults(
            body["approval_request"], _LATER_REQUEST_DEFAULTS
        )
    return body


_NO_REQUEST: Mapping[str, Any] = MappingProxyType(
    {"state": None, "approver": None, "approval_jti": None, **_LATER_REQUEST_DEFAULTS}
)


def _request(facts: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    return {**(facts.get("approval_request") or _NO_REQUEST), **changes}


def _decided(event: ApprovalGranted | ApprovalDenied) -> dict[str, Any]:
    """Who decided an approval request: the approver, the agent acting for them and
    their delegation chain (the approver's session, as a call's principal is recorded)."""
    return {
        "approver": event.approver,
        "approver_agent": event.agent or None,
        "approver_delegation": list(event.delegation),
    }


def _gather(old: Mapping[str, Any], event: Event, redactor: Redactor) -> dict[str, Any]:
    """The invocation's audit facts after ``event``; never mutates ``old``."""
    facts = dict(old)
    match event:
        case PolicyDecided():
            facts["principal"] = _principal(
                event.actor, event.tenant, event.roles, event.agent, event.delegation
            )
            facts["decision"] = event.decision
            facts["policy_version"] = event.policy_version
            facts["determining_policies"] = list(event.determining_policies)
            if event.resource_json is not None:  # the owner and attributes evaluated (C7)
                facts["resource"] = parse_json_field(event.resource_json, "resource_json")
            facts.update(tool=event.tool, target=event.target, args_hash=event.args_hash)
            if redactor.active(event.tool):  # sensitive fields: digests only (ADR 0035)
                args = parse_json_field(event.args_json, "args_json")
                secrets = redactor.secrets(event.tool, args)
                for name in ("target", "resource"):
                    if name in facts:
                        facts[name] = redactor.scrub(event.tool, facts[name], secrets)
        case ProposalRejected() if "decision" not in facts:  # rejected before policy ran
            facts["principal"] = _principal(
                event.actor, event.tenant, (), event.agent, event.delegation
            )
            facts["tool"] = event.tool or None
        case ConfirmationAccepted():
            facts["approval"] = {
                "jti": event.approval_jti,
                "approver": event.approver,
                "approved_invocation_id": event.approved_invocation_id,
            }
        case ApprovalRequested():
            facts["approval_request"] = _request(facts, state="pending")
        case ApprovalGrantRecorded():  # a quorum (ADR 0030): who granted, in order
            grants = [*(facts.get("quorum") or {}).get("grants", []), event.approver]
            facts["quorum"] = {"required": event.required, "grants": grants}
        case ApprovalGranted():
            facts["approval_request"] = _request(
                facts, state="granted", approval_jti=event.approval_jti, **_decided(event)
            )
        case ApprovalDenied():
            facts["approval_request"] = _request(facts, state="denied", **_decided(event))
        case ApprovalExpired():
            facts["approval_request"] = _request(facts, state="expired")
        case ReplayServed():
            facts["replay_of"] = event.original_invocation_id
        case ExecutionFailed() if event.upstream_code is not None:
            facts["upstream_code"] = event.upstream_code
    outcome = outcome_for(event)
    if outcome is not None:
        facts["outcome"] = outcome.value
    return facts


def _content(invocation_id: str, partition_key: str, facts: Mapping[str, Any]) -> dict[str, Any]:
    """What the audit record says (C9), before revision, time and chain fields."""
    return {
        "invocation_id": invocation_id,
        "partition_key": partition_key,
        "proposed_by": "model",
        "authorized_by": {
            "decision": facts.get("decision", "none"),
            "principal": facts.get("principal"),
            "policy_version": facts.get("policy_version"),
            "determining_policies": facts.get("determining_policies", []),
            "resource": facts.get("resource"),
            "approval": facts.get("approval"),
        },
        "approval_request": facts.get("approval_request"),
        "tool": facts.get("tool"),
        "target": facts.get("target"),
        "args_hash": facts.get("args_hash"),
        "outcome": facts.get("outcome"),
        "replay_of": facts.get("replay_of"),
        "quorum": facts.get("quorum"),
        "upstream_code": facts.get("upstream_code"),
    }


# The entry of an invocation the state has not seen yet (read-only: ``project`` copies).
_UNSEEN: Mapping[str, Any] = MappingProxyType(
    {"facts": MappingProxyType({}), "audited": None, "revision": 0}
)


def project(
    state: AuditState, event: Event, redactor: Redactor = NO_REDACTION
) -> tuple[AuditState, tuple[ViewRecord, ...]]:
    """Fold one event; append a chained record when a settled invocation's record changes."""
    if type(event).TOPIC != EVENTS_TOPIC:
        return state, ()
    inv, pk = subject_of(event), event.partition_key
    old = state.invocations.get(inv, _UNSEEN)
    facts = _gather(old["facts"], event, redactor)
    if facts == old["facts"]:
        return state, ()
    entry = {**old, "facts": facts}
    if facts.get("outcome") in TERMINAL:  # only a settled record is written (and digested)
        content = _content(inv, pk, facts)
        plain = is_plain(content)
        digest = sha256_hex(plain_json(content) if plain else canonical_json(content))
        if digest != old["audited"]:
            return _append(state, entry, content, plain, digest, event)
    invocations = MappingProxyType({**state.invocations, inv: entry})
    return AuditState(state.seq, state.head_hash, invocations), ()


_CHAIN_FIELDS = ("revision", "occurred_at", "seq", "prev_hash")


def _append(
    state: AuditState,
    entry: dict[str, Any],
    content: dict[str, Any],
    plain: bool,
    digest: str,
    event: Event,
) -> tuple[AuditState, tuple[ViewRecord, ...]]:
    """Chain a new record of ``content`` after the head of ``state``.

    The record is encoded twice (without its hash, to hash it; then stored): when
    ``content`` was ``plain`` and the chain fields are too, so is the record (canonical.py),
    and neither encoding checks it again.
    """
    inv, pk = content["invocation_id"], content["partition_key"]
    record = {
        **content,
        "revision": entry["revision"] + 1,
        "occurred_at": event.occurred_at,
        "seq": state.seq + 1,
        "prev_hash": state.head_hash,
    }
    plain = plain and all(is_plain(record[name]) for name in _CHAIN_FIELDS)
    encode = plain_json if plain else canonical_json
    # ``record_hash(record)``, without copying ``record`` minus a "hash" it has not got yet
    # (nor the later fields of its principal or approval request when they are at their
    # default: ``_hashed``).
    hashed = _hashed(record) if _has_later_defaults(record) else record
    record["hash"] = sha256_hex(state.head_hash + encode(hashed))  # a str: plain
    entry.update(audited=digest, revision=record["revision"])
    invocations = MappingProxyType({**state.invocations, inv: entry})
    new = AuditState(record["seq"], record["hash"], invocations)
    principal = content["authorized_by"]["principal"]
    tenant = principal["tenant"] if principal else None
    return new, (
        ViewRecord(VIEW, audit_key(pk, new.seq), encode(record), tenant),
        ViewRecord.of(HEAD_VIEW, pk, new.head(pk), tenant),
    )


def _has_later_defaults(record: Mapping[str, Any]) -> bool:
    principal, request = record["authorized_by"]["principal"], record["approval_request"]
    if any(record.get(k) == d for k, d in _LATER_RECORD_DEFAULTS.items()):
        return True
    return any(
        part is not None and any(part.get(k) == d for k, d in defaults.items())
        for part, defaults in (
            (principal, _LATER_PRINCIPAL_DEFAULTS),
            (request, _LATER_REQUEST_DEFAULTS),
        )
    )


class AuditProjection(Projection[AuditState]):
    name = "audit-projection"
    views = frozenset({VIEW, HEAD_VIEW})
    # No audit fact: ``_gather`` has no case for these and ``outcome_for`` gives None.
    reacts_to = (
        LOG_EVENTS
        - {
            ApprovalDecisionRejected,
            DryRunRecorded,
            DryRunRequested,
            ExecutionStarted,
            ReconciliationRequested,
        }
        - USAGE_EVENTS
    )

    def __init__(self, redactor: Redactor = NO_REDACTION) -> None:
        self.redactor = redactor

    def initial_state(self) -> AuditState:
        return AuditState()

    def project(self, state: AuditState, event: Event) -> tuple[AuditState, Sequence[ViewRecord]]:
        return project(state, event, self.redactor)

    def dump_state(self, state: AuditState) -> bytes:
        # An exact dict: canonical_json writes it in one C pass (a mapping proxy takes the
        # rebuilding path, the hot spot of this projection).
        invocations = dict(state.invocations)
        raw = {"seq": state.seq, "head_hash": state.head_hash, "invocations": invocations}
        return canonical_json(raw).encode()

    def load_state(self, data: bytes) -> AuditState:
        raw = load_json_object(data)
        return AuditState(raw["seq"], raw["head_hash"], MappingProxyType(raw["invocations"]))


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """``records``: how many records verified before the first bad one (all, when ok)."""

    ok: bool
    records: int
    first_bad: str | None = None
    reason: str | None = None


def verify_chain(
    records: Iterable[Mapping[str, Any]], heads: Iterable[Mapping[str, Any]] | None = None
) -> VerifyResult:
    """Check every partition key's chain, records in stored order (C9).

    Detects a changed field (hash), an inserted, duplicated, removed or reordered record
    (``seq`` and ``prev_hash`` continuity from ``GENESIS``). With ``heads`` (values of
    view ``audit_head`` or ``AuditState.head``) also a chain cut short at its end, a
    chain with records beyond its head, and a whole chain gone missing.
    """
    tips: dict[str, tuple[int, str]] = {}
    good = 0
    for index, record in enumerate(records):
        pk, seq = str(record.get("partition_key")), record.get("seq")
        label = audit_key(pk, seq) if isinstance(seq, int) else f"{pk}:#{index}"
        last_seq, last_hash = tips.get(pk, (0, GENESIS))
        if seq != last_seq + 1 or type(seq) is not int:
            reason = f"expected seq {last_seq + 1}, found {seq!r}"
            return VerifyResult(False, good, label, reason)
        if record.get("prev_hash") != last_hash:
            return VerifyResult(False, good, label, "prev_hash is not the previous record's hash")
        if record.get("hash") != record_hash(record):
            return VerifyResult(False, good, label, "hash does not match the record's content")
        tips[pk] = (seq, record["hash"])
        good += 1
    if heads is not None:
        expected = {str(h["partition_key"]): (h["seq"], h["hash"]) for h in heads}
        for pk in sorted(expected.keys() | tips.keys()):
            seq, last = tips.get(pk, (0, GENESIS))
            head_seq, head_hash = expected.get(pk, (0, GENESIS))
            if seq != head_seq:
                reason = f"chain ends at seq {seq}, its head is at seq {head_seq}"
                return VerifyResult(False, good, audit_key(pk, min(seq, head_seq) + 1), reason)
            if last != head_hash:
                return VerifyResult(False, good, audit_key(pk, seq), "last hash differs from head")
    return VerifyResult(True, good)
