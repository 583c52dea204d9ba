"""The decider's outputs on the ``events`` topic before any approval: rejections, policy
decisions, resource descriptions, confirmations and dry-run requests.
"""

from __future__ import annotations

from callgate.domain.events.envelope import Event, event_class


@event_class
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


@event_class
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
    # What the catalog entry says of the confirmation, taken when the call is decided (ADR
    # 0029, 0030): a profile reloaded while the approval is pending does not change what
    # was asked. The decider's state is a fold of its events (ADR 0092), so they travel here.
    approver_roles: tuple[str, ...] = ()
    allow_self_approval: bool = False
    approval_ttl_ms: int = 0
    continue_on_approval: bool = False  # false for an evaluation: it continues nothing
    require_dry_run: bool = False
    approvals_required: int = 1
    access_request: bool = False  # ADR 0090: an evaluation whose confirmation is asked for


@event_class
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
    # What the proposal is decided from once the answer comes (ADR 0092: the decider's
    # state is a fold of its events). Empty in records written before.
    args_json: str = ""  # normalized, canonical JSON
    idempotency_key: str | None = None
    roles: tuple[str, ...] = ()
    session_id: str = ""
    session_expires_at: int = 0  # the session is checked again when the proposal is decided
    approval_id: str | None = None
    evaluate_only: bool = False
    access_request: bool = False


@event_class
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


@event_class
class ConfirmationAccepted(Event):
    """A proposal presented a valid approval artifact for this exact call (C4, C11)."""

    approval_jti: str
    approved_invocation_id: str
    approver: str
    # The approval confirmed an evaluation (ARAP re-evaluation, ADR 0090): it settles the
    # evaluation as ``permitted``; nothing runs.
    evaluate_only: bool = False
    # The dry-run snapshot hash the approval bound (what its approver saw).
    dry_run_hash: str = ""


@event_class
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
    # The confirmation the call needs after this dry-run ("none": its execution follows)
    # and the approval it confirms, with the snapshot hash that approval bound (C5, C11;
    # empty when none). Empty in records written before.
    confirmation: str = ""
    approval_jti: str = ""
    approved_dry_run_hash: str = ""
