"""Every callgate event, explicit and greppable (one Avro record per class, same name).

All events share one envelope (``Event``). Payload fields use only Avro-friendly
types: str, int, bool, optional str, tuple[str, ...]. JSON payloads (arguments,
results, dry-run snapshots) travel as canonical JSON strings so that hashes over
them are stable.

Topics (see README "Topics"):
- ``requests``: written by clients (agent platforms, approval UIs):
  ``ToolCallProposed``, ``ApprovalDecisionSubmitted``. They carry the bearer session
  token, so ``requests`` has a bounded retention (``requests_retention_ms``); what the
  decider records on ``events`` is the verified principal and ``session_digest``, never
  the token (ADR 0016).
- ``events``: the authoritative invocation log, written only by callgate services.
- ``dead-letter``: ``EventDeadLettered``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

SCHEMA_VERSION = 1

_E = TypeVar("_E")
# Per event class, its field names in order and a getter of its values as a tuple.
_NAMES: dict[type, tuple[str, ...]] = {}
_VALUES: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def _event_dataclass(cls: type[_E]) -> type[_E]:
    """``@dataclass(frozen=True, slots=True, kw_only=True)``, with the value methods
    (``__eq__``, ``__hash__``, ``__repr__``) those would generate per class defined once, on
    ``Event``, over the class's fields: the same results (equal when of the same class with
    equal fields, the hash of the fields' tuple, ``Name(field=value, ...)``). Generating
    them compiled three functions per class, half of what importing this module cost every
    process at start (about 20 ms of 40 classes)."""
    made = dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)(cls)
    names = tuple(f.name for f in dataclasses.fields(made))  # type: ignore[arg-type]
    _NAMES[made] = names
    _VALUES[made] = attrgetter(*names)  # >1 name: a tuple of the values
    return made


if TYPE_CHECKING:  # what the type checker knows: the frozen keyword-only dataclasses they are
    from typing import dataclass_transform

    @dataclass_transform(frozen_default=True, kw_only_default=True)
    def _event(cls: type[_E]) -> type[_E]: ...

else:
    _event = _event_dataclass


@_event
class Event:
    """The envelope shared by every event."""

    event_id: str
    invocation_id: str
    partition_key: str
    causation_id: str = ""
    correlation_id: str = ""
    occurred_at: int = 0  # epoch milliseconds
    producer: str = ""
    schema_version: int = SCHEMA_VERSION

    TOPIC: ClassVar[str] = "events"

    @property
    def event_type(self) -> str:
        return type(self).__name__

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            values = _VALUES[self.__class__]
            return values(self) == values(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(_VALUES[self.__class__](self))

    def __repr__(self) -> str:
        cls = self.__class__
        shown = ", ".join(
            f"{n}={v!r}" for n, v in zip(_NAMES[cls], _VALUES[cls](self), strict=True)
        )
        return f"{cls.__qualname__}({shown})"

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# --- requests topic (client-written) -------------------------------------------------


@_event
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


@_event
class ApprovalDecisionSubmitted(Event):
    """A human decided on a pending approval; identity comes from ``session_token``."""

    TOPIC: ClassVar[str] = "requests"
    session_token: str
    decision: str  # "grant" | "deny" | WITHDRAW (the actor's own, ADR 0086)
    reason: str = ""


# --- events topic: decider outputs -----------------------------------------------------


@_event
class ProposalRejected(Event):
    """A proposal failed a check before or after policy; ``code`` is the outcome."""

    code: str
    message: str
    tool: str = ""
    actor: str = ""
    tenant: str = ""
    details_json: str = "{}"
    session_digest: str | None = None  # ``token_digest`` of the presented session token
    # The verified session's agent and delegation chain, beside the user (issue 38.4):
    # ``Principal.agent`` and ``Principal.delegation``; empty in records written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@_event
class PolicyDecided(Event):
    """The policy decision on the session principal (C1, C7, C9)."""

    actor: str
    tenant: str
    roles: tuple[str, ...]
    tool: str
    target: str
    args_json: str  # normalized arguments, canonical JSON
    args_hash: str
    fingerprint: str
    idempotency_key: str | None
    policy_version: str
    decision: str  # "permit" | "deny"
    determining_policies: tuple[str, ...]
    mutation: bool
    high_impact: bool
    confirmation: str  # "none" | "owner" | "approver"
    approval_jti: str | None = None
    # The resource facts the ACL evaluated (C7), canonical JSON ``{"source", "tenant",
    # "attributes"}``; None for a call that creates a resource. Replay reads them from
    # here, so a decision is reproduced without asking the provider again (ADR 0014).
    resource_json: str | None = None
    # The verified session: its ``sid`` claim and ``token_digest``; never the bearer token.
    session_id: str | None = None
    session_digest: str | None = None
    # The verified session's agent and delegation chain, beside the user (issue 38.4):
    # ``Principal.agent`` and ``Principal.delegation``; empty in records written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()
    # The decision of an evaluation only (ADR 0083): it settles the invocation.
    evaluate_only: bool = False


@_event
class ResourceDescriptionRequested(Event):
    """C7: the target's owner is not in the profile; ask its system of record (ADR 0014)."""

    tenant: str
    tool: str
    target: str
    provider: str
    # Whom the call acts for (the verified session): a provider that obtains its upstream's
    # token per call asks as this user (ADR 0081). Empty in records written before.
    actor: str = ""
    agent: str = ""
    delegation: tuple[str, ...] = ()


@_event
class ResourceDescribed(Event):
    """What the provider said about the target: owner and attributes (ADR 0014).

    ``found`` false (or no ``owner``) means nobody owns it: the ACL then denies (fail
    closed). ``message`` says why when the provider could not be asked.
    """

    tool: str
    target: str
    provider: str
    found: bool
    owner: str | None
    attributes_json: str  # canonical JSON object
    message: str = ""


@_event
class ConfirmationAccepted(Event):
    """A proposal presented a valid approval artifact for this exact call (C4, C11)."""

    approval_jti: str
    approved_invocation_id: str
    approver: str
    # The approval confirmed an evaluation (ARAP re-evaluation, ADR 0090): it settles the
    # evaluation as ``permitted``; nothing runs.
    evaluate_only: bool = False


@_event
class DryRunRequested(Event):
    tenant: str
    tool: str
    target: str
    args_json: str
    # The catalog+policy version that decided the call (ADR 0067): the executor routes
    # the tool as that version describes it. Empty in records written before it.
    policy_version: str = ""
    # Whom the call acts for, from the verified session (issue 38.5): the executor obtains
    # the upstream's token for this user (``providers.upstream_tokens``). Empty in records
    # written before.
    actor: str = ""
    # The verified session's agent and delegation chain, beside the user (issue 38.4):
    # ``Principal.agent`` and ``Principal.delegation``; empty in records written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@_event
class ApprovalRequested(Event):
    """A pending approval: what the human is asked to confirm (C5)."""

    tenant: str
    actor: str
    tool: str
    target: str
    args_json: str
    args_hash: str
    dry_run_json: str
    dry_run_hash: str
    policy_version: str
    confirmation: str
    approver_roles: tuple[str, ...]
    expires_at: int
    allow_self_approval: bool | None = None  # None: written before the field existed
    approvals_required: int = 1  # distinct approvers who must grant (ADR 0030)
    # ADR 0079: the usage an approver sees when a limit asked for the approval ("" if none).
    usage_json: str = ""
    # The verified session's agent and delegation chain, beside the user (issue 38.4):
    # ``Principal.agent`` and ``Principal.delegation``; empty in records written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@_event
class ApprovalGranted(Event):
    """A signed approval artifact was issued (C11); ``approval_id`` is the artifact."""

    approval_id: str
    approval_jti: str
    approver: str
    expires_at: int
    session_digest: str | None = None  # ``token_digest`` of the approver's session token
    # Everyone whose grant made up the quorum, in order (ADR 0030); empty: ``approver`` alone.
    approvers: tuple[str, ...] = ()
    # The approver's agent and delegation chain, beside the approver (issue 38.4): the
    # approver's ``Principal.agent`` and ``Principal.delegation``; empty in records
    # written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@_event
class ApprovalGrantRecorded(Event):
    """One approver's grant towards a quorum (ADR 0030), bound to the invocation's
    snapshot, arguments and policy version; the artifact is issued only at the quorum."""

    approver: str
    granted: int  # grants so far, this one included
    required: int
    args_hash: str
    dry_run_hash: str
    policy_version: str
    session_digest: str | None = None
    # The approver's agent and delegation chain, beside the approver (issue 38.4): the
    # approver's ``Principal.agent`` and ``Principal.delegation``; empty in records
    # written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@_event
class ApprovalDenied(Event):
    approver: str
    reason: str
    session_digest: str | None = None  # ``token_digest`` of the approver's session token
    # The approver's agent and delegation chain, beside the approver (issue 38.4): the
    # approver's ``Principal.agent`` and ``Principal.delegation``; empty in records
    # written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@_event
class ApprovalExpired(Event):
    """A pending approval, or an unused granted artifact, ran out of time."""

    stage: str  # "pending" | "granted"
    approval_jti: str = ""


@_event
class ApprovalDecisionRejected(Event):
    """A submitted approval decision was refused (bad token, wrong approver, not pending)."""

    code: str
    message: str
    approver: str = ""
    session_digest: str | None = None  # ``token_digest`` of the presented session token


@_event
class ExecutionRequested(Event):
    tenant: str
    tool: str
    target: str
    args_json: str
    execution_token: str  # passed through to the provider as its idempotency token
    attempt: int = 1
    # The catalog+policy version that decided the call (ADR 0067): the executor routes
    # the tool as that version describes it. Empty in records written before it.
    policy_version: str = ""
    # Whom the call acts for, from the verified session (issue 38.5): the executor obtains
    # the upstream's token for this user (``providers.upstream_tokens``). Empty in records
    # written before.
    actor: str = ""
    # The verified session's agent and delegation chain, beside the user (issue 38.4):
    # ``Principal.agent`` and ``Principal.delegation``; empty in records written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@_event
class ReconciliationRequested(Event):
    """C12: before any retry, ask the provider what happened to ``execution_token``."""

    tenant: str
    tool: str
    target: str
    args_json: str
    execution_token: str
    original_invocation_id: str
    # The catalog+policy version that decided the call (ADR 0067): the executor routes
    # the tool as that version describes it. Empty in records written before it.
    policy_version: str = ""
    # Whom the call acts for, from the verified session (issue 38.5): the executor obtains
    # the upstream's token for this user (``providers.upstream_tokens``). Empty in records
    # written before.
    actor: str = ""
    # The verified session's agent and delegation chain, beside the user (issue 38.4):
    # ``Principal.agent`` and ``Principal.delegation``; empty in records written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@_event
class ReplayServed(Event):
    """C8: an idempotency key replayed the stored result of the original authorized call."""

    original_invocation_id: str
    original_outcome: str
    result_json: str


# --- events topic: executor outputs ----------------------------------------------------


@_event
class DryRunRecorded(Event):
    snapshot_json: str
    snapshot_hash: str


@_event
class DryRunFailed(Event):
    message: str
    code: str = ""  # as ``ExecutionFailed.code``


@_event
class ExecutionStarted(Event):
    """Written before the provider is called, so a crash leaves a trace to reconcile."""

    execution_token: str
    attempt: int


@_event
class ExecutionSucceeded(Event):
    execution_token: str
    result_json: str


@_event
class ExecutionFailed(Event):
    execution_token: str
    message: str
    # The outcome when it is not ``execution_failed``: ``token_exchange_failed`` when the
    # upstream's token could not be obtained (nothing was sent). Empty: execution_failed.
    code: str = ""
    # The upstream's JSON-RPC error, when it answered with one (released v10): its code,
    # message and data (canonical JSON, empty when it sent none or too much), which the
    # agent is answered with. None and empty in other failures and in records before.
    upstream_code: int | None = None
    upstream_message: str = ""
    upstream_data_json: str = ""


@_event
class ExecutionUncertain(Event):
    """C12: the provider timed out or the executor crashed; the effect may or may not exist."""

    execution_token: str
    reason: str


@_event
class ExecutionReconciled(Event):
    """C12: the provider's ``lookup`` told what happened to ``execution_token``."""

    execution_token: str
    found: bool
    result_json: str = ""
    original_invocation_id: str = ""


# --- dead-letter topic -----------------------------------------------------------------


@_event
class EventDeadLettered(Event):
    """Input that could not be decoded or validated, kept with its reason and original bytes."""

    TOPIC: ClassVar[str] = "dead-letter"
    code: str
    reason: str
    source_topic: str
    source_partition: int
    source_offset: int
    original: bytes


# --- events topic: policy versions (ADR 0050) --------------------------------------------

# Every policy-version event shares one partition key, so on Kafka they keep one order.
POLICY_KEY = "policy"


@_event
class PolicyPublished(Event):
    """An operator published a catalog+policy version; ``version`` is its digest.

    The content travels whole (``profile_yaml``, ``policy_text``): the version is the digest
    of what ``parse_profile`` reads from them, so the event is its own content address."""

    version: str
    author: str
    tenant: str
    reason: str
    profile_yaml: str
    policy_text: str


@_event
class PolicyActivated(Event):
    """An operator made a published version the one every decider decides with, from this
    event's position in the log on (rolling back: activating an earlier version)."""

    version: str
    author: str
    tenant: str
    reason: str


@_event
class PolicyShadowSet(Event):
    """An operator set the published version decided beside the active one on every live
    call (``version`` empty: shadowing off). A shadow never changes an outcome."""

    version: str
    author: str
    tenant: str
    reason: str


@_event
class ShadowDecisionDiffered(Event):
    """The shadow version decided a live call otherwise than the active version did."""

    tool: str
    actor: str
    call_tenant: str
    active_version: str
    active_outcome: str
    candidate_version: str
    candidate_outcome: str
    reason: str
    # The verified session's agent and delegation chain, beside the user (issue 38.4):
    # ``Principal.agent`` and ``Principal.delegation``; empty in records written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


# --- events topic: freezes (ADR 0054) ----------------------------------------------------


@_event
class FreezeApplied(Event):
    """An operator stopped every call of one tool, tenant or actor (``scope``: tool, tenant
    or actor; ``value``: its exact name), on every instance, from this event on."""

    scope: str
    value: str
    reason: str
    author: str
    tenant: str


@_event
class FreezeLifted(Event):
    """An operator lifted the freeze of ``scope`` ``value``."""

    scope: str
    value: str
    reason: str
    author: str
    tenant: str


# --- events topic: pinned upstream tools (ADR 0066) -------------------------------------


@_event
class ToolPinned(Event):
    """An operator pinned catalog ``tool`` to the upstream definition with ``digest``."""

    tool: str
    digest: str
    reason: str
    author: str
    tenant: str


@_event
class ToolDefinitionChanged(Event):
    """The upstream served catalog ``tool`` with another definition than last recorded:
    ``seen_digest``; ``pinned_digest`` is the pin in force when it was seen."""

    tool: str
    pinned_digest: str
    seen_digest: str


# --- events topic: usage limits (ADR 0079) ----------------------------------------------
# Keyed by a limit's scope (``UsageLimit.scope_key``) when they go to the usage process,
# by the invocation's partition key when they answer it.


@_event
class UsageReserveRequested(Event):
    """The invocation asks its limit's usage to hold ``amount`` under ``reservation_id``;
    the limit as the deciding profile declares it travels along (the usage process keeps
    no profile). ``reply_key``: the invocation's partition key, where the answer goes."""

    limit: str
    reservation_id: str
    amount: int
    limit_max: int
    window_ms: int  # 0: calls in flight
    over: str  # "refuse" | "approve"
    reply_key: str
    tool: str
    scope_json: str  # the scope's exact values, canonical JSON


@_event
class UsageReserved(Event):
    """The amount is held; ``used`` is the usage before it. ``over_limit``: it went past
    the limit because the limit's ``over`` is ``approve`` (an approver decides)."""

    limit: str
    reservation_id: str
    scope_key: str
    amount: int
    used: int
    limit_max: int
    window_ms: int
    over_limit: bool


@_event
class UsageRefused(Event):
    """The amount does not fit: nothing is held. ``retry_after_ms``: when it would fit as
    committed usage leaves the window (0: when calls in flight settle; -1: never)."""

    limit: str
    reservation_id: str
    scope_key: str
    amount: int
    used: int
    limit_max: int
    window_ms: int
    retry_after_ms: int


@_event
class UsageCommitted(Event):
    """The reserved call ran (or may have: ``outcome_uncertain`` counts once): its amount
    counts for the window from ``occurred_at``."""

    limit: str
    reservation_id: str
    window_ms: int


@_event
class UsageReleased(Event):
    """The reserved call will not run: what it held is given back."""

    limit: str
    reservation_id: str
    reason: str


@_event
class UsageLimitChanged(Event):
    """An operator changed one limit's usage in one scope (keyed by the scope): ``reset``
    forgets what was committed (reservations stay held), ``raise`` adds ``raise_by`` to
    the scope's limit until the next reset. Authored by a verified operator, with a
    reason: the log is its audit."""

    limit: str
    scope_json: str  # the scope's exact values, canonical JSON
    action: str  # "reset" | "raise"
    raise_by: int
    reason: str
    author: str
    tenant: str  # the operator's tenant


REQUEST_TYPES: tuple[type[Event], ...] = (ToolCallProposed, ApprovalDecisionSubmitted)

EVENT_TYPES: tuple[type[Event], ...] = (
    ToolCallProposed,
    ApprovalDecisionSubmitted,
    ProposalRejected,
    PolicyDecided,
    ResourceDescriptionRequested,
    ResourceDescribed,
    ConfirmationAccepted,
    DryRunRequested,
    ApprovalRequested,
    ApprovalGranted,
    ApprovalGrantRecorded,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalDecisionRejected,
    ExecutionRequested,
    ReconciliationRequested,
    ReplayServed,
    DryRunRecorded,
    DryRunFailed,
    ExecutionStarted,
    ExecutionSucceeded,
    ExecutionFailed,
    ExecutionUncertain,
    ExecutionReconciled,
    EventDeadLettered,
    PolicyPublished,
    PolicyActivated,
    PolicyShadowSet,
    ShadowDecisionDiffered,
    FreezeApplied,
    FreezeLifted,
    ToolPinned,
    ToolDefinitionChanged,
    UsageReserveRequested,
    UsageReserved,
    UsageRefused,
    UsageCommitted,
    UsageReleased,
    UsageLimitChanged,
)

BY_NAME: dict[str, type[Event]] = {cls.__name__: cls for cls in EVENT_TYPES}


def event_from_dict(event_type: str, data: dict[str, Any]) -> Event:
    """Build an event from a decoded dict; lists become tuples to keep events immutable."""
    cls = BY_NAME[event_type]
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {
        k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in fields
    }
    return cls(**kwargs)
