"""Request and response bodies, as the OpenAPI document describes them.

Response shapes are the CLI's ``--json`` shapes (docs/contract.md "Command line"): the routes
return the SDK's answers as they are, and these models only describe them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

from callgate.domain.codes import Code


class _Open(BaseModel):
    """A view value: the named fields, and whatever the view adds later."""

    model_config = ConfigDict(extra="allow")


class ErrorDetail(BaseModel):
    code: Code
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class ProposalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool: str = Field(min_length=1, max_length=200, description="a tool of the catalog")
    args: dict[str, Any] = Field(description="the tool's arguments, a JSON object")
    approval_id: str | None = Field(
        default=None, max_length=16384, description="the artifact a confirming call presents"
    )


class OutcomeError(_Open):
    code: Code
    message: str


class ProposeAnswer(_Open):
    """``callgate propose --json``; ``settled: false`` only when the wait ran out (202);
    ``invocation_id`` null for a call refused before it was published (422)."""

    invocation_id: str | None
    outcome: Code
    error: OutcomeError | None = None
    result: Any = None
    dry_run: Any = None
    approval_id: str | None = None
    replay_of: dict[str, Any] | None = None
    settled: bool | None = None


class AnswerOrError(RootModel[ProposeAnswer | ErrorBody]):
    """A 422 of ``POST /v1/proposals``: refused arguments (an answer) or a bad request."""


class Status(_Open):
    """``callgate status --json``: the invocation's status view value."""

    invocation_id: str
    outcome: Code
    settled: bool
    tool: str | None = None
    actor: str | None = None
    tenant: str | None = None
    target: str | None = None
    final: bool | None = None  # with ?wait=: nothing more will happen by itself (ADR 0029)


class UsageItem(_Open):
    """One limit's usage in one scope (ADR 0079): ``used`` counted at the time of asking
    (held plus what committed inside the window), against ``max``."""

    key: str
    limit: str
    scope: dict[str, str]
    used: int
    max: int
    held: int
    window_ms: int
    raised: int
    changes: list[dict[str, Any]]


class PendingItem(_Open):
    """One pending approval: what the human confirms and what the approval will bind."""

    invocation_id: str
    tool: str
    tenant: str
    actor: str
    target: str
    args: dict[str, Any]
    dry_run: Any = None
    confirmation: str
    approver_roles: list[str] = []
    expires_at: int
    policy_version: str
    args_hash: str | None = None
    dry_run_hash: str | None = None


class DenyIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=2000)


class Approved(BaseModel):
    """A grant: the artifact once the quorum is met (ADR 0030), then what became of the
    continued call (``outcome``, ADR 0029); before, how many of the required granted."""

    invocation_id: str
    approval_id: str | None = None
    expires_at: int | None = None
    outcome: str | None = None
    granted: int | None = None
    required: int | None = None


class Denied(BaseModel):
    invocation_id: str
    denied: bool
    reason: str


class AuditRecord(_Open):
    invocation_id: str
    proposed_by: str
    authorized_by: dict[str, Any]
    outcome: str | None = None


class Verified(BaseModel):
    ok: bool
    records: int
    first_bad: str | None = None
    reason: str | None = None


class PolicyHistory(_Open):
    active: str | None = None
    shadow: str | None = None
    history: list[dict[str, Any]]


class ShadowReport(_Open):
    differed: int
    by_transition: dict[str, int]
    differences: list[dict[str, Any]]


class SessionInfo(BaseModel):
    user: str
    tenant: str
    roles: list[str]
    expires_at: int
    # Signed in by the console's session cookie: the value to send as X-CSRF-Token on
    # every state-changing request. None for a bearer token.
    csrf_token: str | None = None


class SlackDecision(BaseModel):
    invocation_id: str
    decision: str  # granted or denied
    approver: str
    approval_id: str | None = None


class SignInProvider(BaseModel):
    name: str
    issuer: str
    sign_in_url: str


class Health(BaseModel):
    status: str
    reason: str | None = None


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer."""
    return {s: {"model": ErrorBody, "description": "a coded error"} for s in statuses}


# Every /v1 route can answer these (session, body limit, rate limit, failures, and 503 when
# the broker or the disk under the state directory is unavailable).
COMMON = (401, 413, 422, 429, 500, 503)
