"""The decider's per-partition-key state: immutable values, folded from the events it
consumed and emitted by ``decider.evolve`` alone (ADR 0092).

Everything here is derived from the log (docs/contract.md "Shape"): the runner stores it next to
the consumed position (embedded) or in a changelog inside the same transaction (Kafka),
so it can always be rebuilt, and restoring it calls no provider. The records and the state
are typed named tuples (``Invocation``, ``KeyRecord``, ``ApprovalUse``, ``DeciderState``);
their sequences are tuples and the state's mappings are never changed in place (``evolve``
builds new ones), so a state handed to a rule, a runner or a test stays what it was. Named tuples
rather than frozen dataclasses: a frozen dataclass's ``__init__`` sets each of an
``Invocation``'s forty-odd fields through ``object.__setattr__``, about five times the cost
of a tuple built in C, and ``evolve`` builds one per event.
Serialization is sorted-key JSON so that equal states are equal bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json, state_json
from callgate.domain.principal import Principal

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Phase:
    """Where an invocation is in its lifecycle."""

    DESCRIBING = "describing"  # asked the provider who owns the target (C7, ADR 0014)
    RESERVING = "reserving"  # asked the usage of the limits that cover it (ADR 0079)
    AWAITING_DRY_RUN = "awaiting_dry_run"  # dry-run before asking for approval (C5)
    DRY_RUN_THEN_EXECUTE = "dry_run_then_execute"  # mandatory dry-run, no confirmation
    CONFIRMING = "confirming"  # approval presented; re-running the dry-run to compare (C11)
    PENDING_APPROVAL = "pending_approval"
    EXECUTING = "executing"
    WAITING = "waiting"  # a replay attempt waiting for the original to settle (C8)
    SETTLED = "settled"


# A reservation's states in ``Invocation.usage`` (``decider.limits``, ADR 0079).
ASKED, RESERVED, REFUSED, COMMITTED, RELEASED = (
    "asked",
    "reserved",
    "refused",
    "committed",
    "released",
)


class KeyStatus:
    """Status of an idempotency key's original authorized call (C8)."""

    PENDING_APPROVAL = "pending_approval"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    EXECUTING = "executing"
    UNCERTAIN = "uncertain"
    RECONCILING = "reconciling"
    DONE = "done"


class ApprovalStatus:
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"


class Invocation(NamedTuple):
    invocation_id: str
    phase: str
    outcome: str
    partition_key: str = ""
    tool: str = ""
    actor: str = ""
    tenant: str = ""
    target: str = ""
    args_json: str = "{}"
    args_hash: str = ""
    fingerprint: str = ""
    policy_version: str = ""
    idempotency_key: str | None = None
    confirmation: str = "none"
    approver_roles: tuple[str, ...] = ()
    allow_self_approval: bool = False
    approval_ttl_ms: int = 0
    # Taken from the catalog entry when the call is decided (ADR 0029, 0030): a profile
    # reloaded while the approval is pending does not change what was asked.
    continue_on_approval: bool = False
    require_dry_run: bool = False
    approvals_required: int = 1
    grants: tuple[str, ...] = ()  # approvers so far (quorum, ADR 0030)
    dry_run_json: str = ""
    dry_run_hash: str = ""
    approval_status: str = ""  # for the approval requested *for* this invocation
    approval_expires_at: int = 0
    approval_jti: str = ""  # the approval this invocation presented (confirmation)
    approved_dry_run_hash: str = ""  # what that approval's human saw
    execution_token: str = ""
    attempt: int = 0
    result_json: str = ""
    # ExecutionReconciled events already acted on: a redelivered one must not retry (C12).
    reconciliations: tuple[str, ...] = ()
    # The last attempt the executor reported started: a lookup that finds nothing retries
    # only the current attempt, once (two lookups of one attempt, one retry; C12).
    started_attempt: int = 0
    # While DESCRIBING: the verified session and the proposal, to decide once described;
    # ``agent`` and ``delegation`` are kept after (recorded on the events the call leads to).
    roles: tuple[str, ...] = ()
    session_id: str = ""
    session_expires_at: int = 0
    agent: str = ""
    delegation: tuple[str, ...] = ()  # ``Principal.delegation``
    approval_id: str | None = None
    proposal_event_id: str = ""
    # While RESERVING: the resource facts the policy will read (``ResourceFacts.to_json``;
    # empty for a call that creates a resource).
    facts_json: str = ""
    # The reservations of the limits that cover the call (``decider.limits``): plain
    # dicts of str and int, so the state stays sorted-key JSON; never changed in place.
    usage: tuple[dict[str, Any], ...] = ()
    # An evaluation only (AuthZEN, ADR 0083): settled by its policy decision.
    evaluate_only: bool = False
    # An ARAP access request (ADR 0090): an evaluation whose confirmation is asked for.
    access_request: bool = False


class KeyRecord(NamedTuple):
    """The original authorized call behind an idempotency key (C8)."""

    actor: str
    tool: str
    target: str
    fingerprint: str
    invocation_id: str  # the invocation whose approval / execution the key stands for
    status: str
    execution_token: str = ""
    outcome: str = ""
    result_json: str = ""
    waiters: tuple[str, ...] = ()


class ApprovalUse(NamedTuple):
    """A granted approval artifact: single use (C11)."""

    invocation_id: str  # the invocation it was requested for
    status: str  # granted | expired
    expires_at: int
    consumed_by: str = ""  # the invocation that used it
    consumer_key: str | None = None  # that invocation's idempotency key
    approver: str = ""  # who granted it (C9: a retry that takes over names it too)


class DeciderState(NamedTuple):
    """A partition key's invocations, idempotency keys and approval artifacts. The mappings
    are never changed in place: ``evolve`` builds a new one for each it changes (the empty
    ones are read-only)."""

    invocations: Mapping[str, Invocation] = _EMPTY
    keys: Mapping[str, KeyRecord] = _EMPTY
    approvals: Mapping[str, ApprovalUse] = _EMPTY
    decisions_seen: tuple[str, ...] = ()  # ApprovalDecisionSubmitted ids

    def next_due(self) -> int | None:
        times = [
            inv.approval_expires_at
            for inv in self.invocations.values()
            if inv.approval_status == ApprovalStatus.PENDING
        ]
        times += [
            a.expires_at for a in self.approvals.values() if a.status == ApprovalStatus.GRANTED
        ]
        return min(times) if times else None


def parked_fields(
    p: ev.ToolCallProposed, principal: Principal, target: str, args: dict[str, Any]
) -> dict[str, Any]:
    """What a proposal parked until an answer (its target's description, its limits' usage)
    is decided from once answered: the request for that answer carries it, and ``evolve``
    keeps it on the parked invocation."""
    return {
        "tenant": principal.tenant,
        "target": target,
        "actor": principal.user,
        "agent": principal.agent,
        "delegation": principal.delegation,
        "args_json": canonical_json(args),
        "idempotency_key": p.idempotency_key,
        "roles": principal.roles,
        "session_id": principal.session_id,
        "session_expires_at": principal.expires_at,
        "approval_id": p.approval_id,
        "evaluate_only": p.evaluate_only,
        "access_request": p.access_request,
    }


def key_record(state: DeciderState, inv: Invocation) -> KeyRecord | None:
    """The record of ``inv``'s idempotency key, if it has one and the key is held (C8)."""
    return state.keys.get(inv.idempotency_key) if inv.idempotency_key is not None else None


def _plain(record: Invocation | KeyRecord | ApprovalUse) -> dict[str, Any]:
    # Shallow on purpose: every field is a str, int, bool, None or tuple of str, which json
    # encodes as it is (a nested record would make state_json raise, never pass silently).
    # A deep copy (``dataclasses.asdict``) cost the decider about a fifth of its CPU time on
    # Kafka (docs/benchmarks.md); a record is a tuple, zipped with its names in C.
    return dict(zip(record._fields, record, strict=True))


_Record = TypeVar("_Record", Invocation, KeyRecord, ApprovalUse)
_INDEX: dict[type, dict[str, int]] = {
    cls: {name: i for i, name in enumerate(cls._fields)}
    for cls in (Invocation, KeyRecord, ApprovalUse)
}


def evolved(record: _Record, **changes: Any) -> _Record:
    """``record`` with ``changes`` (``_replace`` without its per-field Python work)."""
    values = list(record)
    index = _INDEX[type(record)]
    for name, value in changes.items():
        values[index[name]] = value
    return tuple.__new__(type(record), values)


def dump_state(state: DeciderState) -> bytes:
    """Sorted-key JSON of ``state`` (what ``dataclasses.asdict`` holds): equal states are
    equal bytes (``canonical.state_json``)."""
    return state_json(
        {
            "invocations": {k: _plain(v) for k, v in state.invocations.items()},
            "keys": {k: _plain(v) for k, v in state.keys.items()},
            "approvals": {k: _plain(v) for k, v in state.approvals.items()},
            "decisions_seen": state.decisions_seen,
        }
    )


def load_state(data: bytes) -> DeciderState:
    return state_from(json.loads(data))  # exact ints: orjson reads a huge one as a float


def state_from(raw: dict[str, Any]) -> DeciderState:
    """The state ``dump_state`` wrote, parsed (its JSON arrays back to tuples)."""
    return DeciderState(
        invocations={k: _invocation(v) for k, v in raw["invocations"].items()},
        keys={
            k: KeyRecord(**{**v, "waiters": tuple(v["waiters"])}) for k, v in raw["keys"].items()
        },
        approvals={k: ApprovalUse(**v) for k, v in raw["approvals"].items()},
        decisions_seen=tuple(raw.get("decisions_seen", ())),
    )


def _invocation(raw: dict[str, Any]) -> Invocation:
    for name in _INVOCATION_SEQUENCES:
        if name in raw:
            raw[name] = tuple(raw[name])
    return Invocation(**raw)


_INVOCATION_SEQUENCES = tuple(
    name for name, default in Invocation._field_defaults.items() if default == ()
)
