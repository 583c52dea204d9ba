"""The approval events on the ``events`` topic: requested, granted (and the grant's record),
denied, expired, and a decision the decider rejected.
"""

from __future__ import annotations

from callgate.domain.events.envelope import Event, event_class


@event_class
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


@event_class
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


@event_class
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


@event_class
class ApprovalDenied(Event):
    approver: str
    reason: str
    session_digest: str | None = None  # ``token_digest`` of the approver's session token
    # The approver's agent and delegation chain, beside the approver (issue 38.4): the
    # approver's ``Principal.agent`` and ``Principal.delegation``; empty in records
    # written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@event_class
class ApprovalExpired(Event):
    """A pending approval, or an unused granted artifact, ran out of time."""

    stage: str  # "pending" | "granted"
    approval_jti: str = ""


@event_class
class ApprovalDecisionRejected(Event):
    """A submitted approval decision was refused (bad token, wrong approver, not pending)."""

    code: str
    message: str
    approver: str = ""
    session_digest: str | None = None  # ``token_digest`` of the presented session token
