"""The OpenID AuthZEN Authorization API 1.0 (ADR 0083): a thin translation onto the SDK.

A policy enforcement point (a gateway in front of an API) asks whether a subject may do
an action on a resource. callgate answers as it decides every call, with nothing run:
``Gateway.evaluate`` publishes the call as a proposal with ``evaluate_only``, the decider
takes it through the same checks (session, catalog, schema, identity, freeze, pin,
policy) and its recorded decision settles it, so it is in the audit like any other.

The subject is never taken on the caller's word (C6). The PEP authenticates with its own
bearer session, which must hold ``PEP_ROLE``; the subject is the session whose token the
PEP forwards in ``subject.properties.token``, verified here and again by the decider, and
``subject.id`` must be that session's user. Mapping (docs/contract.md "AuthZEN"):
``action.name`` is the tool; ``resource.type`` names the tool's target argument and
``resource.id`` is its value (a tool without one takes ``{"type": "tool", "id": <tool>}``);
``context`` holds the tool's other arguments. Other properties are not read: the policy
sees only what callgate verifies.

ARAP (ADR 0090): an evaluation that needs a confirmation is a requestable denial
(``context.access_request``, bound by ``context.evaluation_id``, the evaluation's
invocation id); ``routers/access_requests.py`` takes the access request. A re-evaluation
presents the approval at ``context.approval`` (not a tool argument); the decider checks
it as a call's approval and permits the evaluation once.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict, Field

from callgate.domain.access_requests import (
    CAPABILITY,
    REQUESTABLE_REASON,
    REQUESTABLE_S,
    reevaluation_denial,
    rfc3339,
)
from callgate.domain.approvals import peek_claim
from callgate.domain.codes import Code, Rejection
from callgate.domain.principal import Principal
from callgate.domain.scope import PEP_ROLE
from callgate.surfaces.http.context import ServerContext
from callgate.surfaces.http.deps import ContextDep, bearer
from callgate.surfaces.http.models import errors

router = APIRouter(tags=["authzen"])

EVALUATION_PATH = "/access/v1/evaluation"
EVALUATIONS_PATH = "/access/v1/evaluations"
METADATA_PATH = "/.well-known/authzen-configuration"
REQUESTS_PATH = "/access/v1/requests"  # ARAP's access request endpoint (ADR 0090)
# Where a re-evaluation presents an approved access request's approval (ARAP): profile
# machinery, never a tool argument.
APPROVAL_MEMBER = "approval"
# The most evaluations one batch may hold; each is a decision recorded on the log.
MAX_EVALUATIONS = 64
# A tool without a target argument is asked about as this resource type.
TOOL_RESOURCE = "tool"
REQUEST_ID = "X-Request-ID"
_MAX_REQUEST_ID = 256


class _Entity(BaseModel):
    """Unknown members are ignored, as the specification asks (forward compatibility)."""

    model_config = ConfigDict(extra="allow")


class Subject(_Entity):
    type: str = Field(min_length=1, max_length=200)
    id: str = Field(min_length=1, max_length=1000, description="the forwarded session's user")
    properties: dict[str, Any] | None = Field(
        default=None, description="`token`: the subject's session token (required)"
    )


class Resource(_Entity):
    type: str = Field(min_length=1, max_length=200, description="the tool's target argument")
    id: str = Field(min_length=1, max_length=4096, description="the target")
    properties: dict[str, Any] | None = None


class Action(_Entity):
    name: str = Field(min_length=1, max_length=200, description="the tool")
    properties: dict[str, Any] | None = None


class EvaluationIn(_Entity):
    subject: Subject
    action: Action
    resource: Resource
    context: dict[str, Any] | None = Field(
        default=None, description="the tool's arguments other than the target"
    )


class EvaluationItem(_Entity):
    """One evaluation of a batch; what it leaves out comes from the request's top level."""

    subject: Subject | None = None
    action: Action | None = None
    resource: Resource | None = None
    context: dict[str, Any] | None = None


class Options(_Entity):
    evaluations_semantic: Literal["execute_all", "deny_on_first_deny", "permit_on_first_permit"] = (
        "execute_all"
    )


class EvaluationsIn(EvaluationItem):
    evaluations: list[EvaluationItem] | None = Field(default=None, max_length=MAX_EVALUATIONS)
    options: Options | None = None


class Decision(BaseModel):
    decision: bool
    context: dict[str, Any] | None = Field(
        default=None,
        description="on a denial: `outcome` (a code of callgate's vocabulary), "
        "`invocation_id` (its audit record), `reason_admin`",
    )


class Decisions(BaseModel):
    evaluations: list[Decision]


class Metadata(BaseModel):
    policy_decision_point: str
    access_evaluation_endpoint: str
    access_evaluations_endpoint: str
    access_request_endpoint: str
    capabilities: list[str]


def pep(
    ctx: ContextDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The PEP's own verified bearer session with ``PEP_ROLE``: ``401 unauthenticated``
    without one, ``403 pep_required`` without the role. No cookie: a PEP is no browser."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Rejection(Code.UNAUTHENTICATED, "the PEP sends Authorization: Bearer <its token>")
    with ctx.lock:  # the verifier's cache is not thread-safe
        principal = ctx.verifier.verify(credentials.credentials, ctx.gateway.app.clock())
    if not principal.has_any_role((PEP_ROLE,)):
        raise Rejection(Code.PEP_REQUIRED, f"AuthZEN evaluations need the {PEP_ROLE} role")
    return principal


PepDep = Annotated[Principal, Depends(pep)]


def _subject_session(ctx: ServerContext, caller: Principal, subject: Subject) -> str:
    """The subject's verified session token (C6): never the subject's word alone."""
    token = (subject.properties or {}).get("token")
    if not isinstance(token, str) or not token:
        raise Rejection(
            Code.UNAUTHENTICATED,
            "subject.properties.token: forward the subject's session token; a subject is "
            "never taken on the caller's word",
        )
    with ctx.lock:
        principal = ctx.verifier.verify(token, ctx.gateway.app.clock())
    if principal.user != subject.id:
        raise Rejection(
            Code.IDENTITY_SPOOF, "subject.id is not the user of the forwarded session token"
        )
    if principal.tenant != caller.tenant:
        raise Rejection(Code.PEP_REQUIRED, "a PEP asks for sessions of its own tenant only")
    return token


def presented(context: Any) -> tuple[dict[str, Any], str | None]:
    """The tool's arguments, and the approval artifact a re-evaluation presents at
    ``context.approval`` (ARAP, ADR 0090): ``id`` must be the id its ``state`` carries
    (``invalid_request`` otherwise); the decider verifies the rest."""
    args = dict(context or {})
    approval = args.pop(APPROVAL_MEMBER, None)
    if approval is None:
        return args, None
    state = approval.get("state") if isinstance(approval, dict) else None
    if not isinstance(state, str) or not state or not isinstance(approval.get("id"), str):
        raise Rejection(
            Code.INVALID_REQUEST,
            "context.approval: the approval of an approved access request, with id and state",
        )
    if peek_claim(state, "jti") != approval["id"]:
        raise Rejection(Code.INVALID_REQUEST, "context.approval: id is not the id of its state")
    return args, state


def _call(
    ctx: ServerContext, action: Action, resource: Resource, args: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The tool and arguments an evaluation asks about (``invalid_request`` otherwise)."""
    spec = ctx.gateway.app.profile.tool(action.name)
    target = None if spec is None else spec.target_arg
    if target is None:
        if spec is not None and (resource.type, resource.id) != (TOOL_RESOURCE, spec.name):
            raise Rejection(
                Code.INVALID_REQUEST,
                f"{spec.name} takes no target: ask about resource "
                f'{{"type": "{TOOL_RESOURCE}", "id": "{spec.name}"}}',
            )
        return action.name, args  # an unknown tool is the decider's to refuse and record
    if resource.type != target:
        raise Rejection(
            Code.INVALID_REQUEST,
            f"resource.type of {spec.name if spec else action.name} is its target "
            f"argument {target!r}, not {resource.type!r}",
        )
    if args.get(target, resource.id) != resource.id:
        raise Rejection(Code.INVALID_REQUEST, f"context.{target} differs from resource.id")
    args[target] = resource.id
    return action.name, args


Call = tuple[str, str, dict[str, Any]]


def _decision(
    ctx: ServerContext, caller: Principal, base: str, answer: dict[str, Any], call: Call,
    reevaluation: bool,
) -> Decision:  # fmt: skip
    """``true`` only for ``permitted``; anything else (a refusal, a call that needs a
    confirmation, no decision within the wait) is ``false``: fail closed. A call that needs
    a confirmation is a requestable denial (ARAP); a re-evaluation refused says why and
    what to do next, with a fresh requestable denial when a new request may help."""
    outcome = str(answer.get("outcome"))
    if outcome == Code.PERMITTED.value:
        if not reevaluation:
            return Decision(decision=True)
        return Decision(decision=True, context={"approval": {"id": _approval_id(ctx, answer)}})
    error = answer.get("error") or {}
    message = error.get("message") or (
        "the call needs a confirmation; an evaluation confirms nothing"
        if outcome == Code.APPROVAL_REQUIRED.value
        else outcome
    )
    context: dict[str, Any] = {
        "outcome": outcome,
        "invocation_id": answer.get("invocation_id"),
        "reason_admin": {"en": message},
    }
    if reevaluation:
        reason, next_action = reevaluation_denial(outcome)
        context.update(reason=reason, next_action=next_action)
        if next_action == "request":
            fresh = ctx.gateway.evaluate([call], ctx.options.propose_wait_s)[0]
            if fresh.get("outcome") == Code.APPROVAL_REQUIRED.value:
                context.update(_requestable(ctx, caller, base, fresh))
                context.update(reason=reason)  # the refusal's, not the fresh denial's
            else:
                context["next_action"] = "none"
    elif outcome == Code.APPROVAL_REQUIRED.value:
        context.update(_requestable(ctx, caller, base, answer))
    return Decision(decision=False, context=context)


def _requestable(
    ctx: ServerContext, caller: Principal, base: str, answer: dict[str, Any]
) -> dict[str, Any]:
    """ARAP's requestable denial: the evaluation's id binds the access request to it (the
    access request endpoint reads the recorded decision), within ``REQUESTABLE_S``."""
    invocation_id = str(answer["invocation_id"])
    status = ctx.gateway.status_for(invocation_id, caller) or {}
    at = int(status.get("updated_at") or ctx.gateway.app.clock())
    return {
        "evaluation_id": invocation_id,
        "evaluated_at": rfc3339(at),
        "reason": REQUESTABLE_REASON,
        "access_request": {
            "endpoint": base + REQUESTS_PATH,
            "expires_at": rfc3339(at + REQUESTABLE_S * 1000),
        },
    }


def _approval_id(ctx: ServerContext, answer: dict[str, Any]) -> str | None:
    """The ``jti`` of the approval a permitted re-evaluation used (its status says)."""
    status = ctx.gateway.answer_status(str(answer["invocation_id"])) or {}
    used = status.get("approved_by") or {}
    jti = used.get("approval_jti")
    return jti if isinstance(jti, str) else None


def _request_id(request: Request, response: Response) -> None:
    """Echo ``X-Request-ID``, as the specification requires of a PDP."""
    value = request.headers.get(REQUEST_ID)
    if value is None:
        return
    if len(value) > _MAX_REQUEST_ID or not value.isprintable():
        raise Rejection(Code.INVALID_REQUEST, f"{REQUEST_ID}: printable, at most 256 characters")
    response.headers[REQUEST_ID] = value


def _evaluate(
    ctx: ServerContext, caller: Principal, items: list[EvaluationIn], semantic: str, base: str
) -> list[Decision]:
    """Every evaluation checked first (a bad one refuses the request, nothing published),
    then decided: all together, or one by one up to the first deny or permit."""
    calls: list[Call] = []
    approvals: list[str | None] = []
    for item in items:
        session = _subject_session(ctx, caller, item.subject)
        args, approval = presented(item.context)
        tool, args = _call(ctx, item.action, item.resource, args)
        calls.append((session, tool, args))
        approvals.append(approval)
    wait = ctx.options.propose_wait_s

    def decide(indices: list[int]) -> list[Decision]:
        picked = [approvals[i] for i in indices]
        answers = ctx.gateway.evaluate([calls[i] for i in indices], wait, picked)
        return [
            _decision(ctx, caller, base, a, calls[i], approvals[i] is not None)
            for i, a in zip(indices, answers, strict=True)
        ]

    if semantic == "execute_all":
        return decide(list(range(len(calls))))
    stop_on = semantic == "permit_on_first_permit"
    decisions: list[Decision] = []
    for index in range(len(calls)):  # in order: the ones after the stop are not decided
        decision = decide([index])[0]
        decisions.append(decision)
        if decision.decision is stop_on:
            break
    return decisions


def base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


@router.get(
    METADATA_PATH,
    operation_id="authzenConfiguration",
    summary="AuthZEN policy decision point metadata",
    response_model=Metadata,
)
def metadata(request: Request) -> Metadata:
    """The PDP's identifier is the URL this document was asked at, less the well-known
    path (the specification's mix-up check compares them)."""
    base = base_url(request)
    return Metadata(
        policy_decision_point=base,
        access_evaluation_endpoint=base + EVALUATION_PATH,
        access_evaluations_endpoint=base + EVALUATIONS_PATH,
        access_request_endpoint=base + REQUESTS_PATH,
        capabilities=[CAPABILITY],
    )


@router.post(
    EVALUATION_PATH,
    operation_id="authzenEvaluation",
    summary="AuthZEN access evaluation: decided like a call, run never (PEPs)",
    response_model=Decision,
    response_model_exclude_none=True,
    responses=errors(400, 401, 403, 413, 429, 500),
)
def evaluation(
    body: EvaluationIn, request: Request, response: Response, caller: PepDep, ctx: ContextDep
) -> Decision:
    _request_id(request, response)
    return _evaluate(ctx, caller, [body], "execute_all", base_url(request))[0]


@router.post(
    EVALUATIONS_PATH,
    operation_id="authzenEvaluations",
    summary="AuthZEN access evaluations: a batch in one round trip (PEPs)",
    response_model=Decisions | Decision,
    response_model_exclude_none=True,
    responses=errors(400, 401, 403, 413, 429, 500),
)
def evaluations(
    body: EvaluationsIn, request: Request, response: Response, caller: PepDep, ctx: ContextDep
) -> Decisions | Decision:
    _request_id(request, response)
    if not body.evaluations:  # the specification: then it is a single evaluation
        single = [_complete(body, EvaluationItem())]
        return _evaluate(ctx, caller, single, "execute_all", base_url(request))[0]
    items = [_complete(body, item) for item in body.evaluations]
    semantic = (body.options or Options()).evaluations_semantic
    return Decisions(evaluations=_evaluate(ctx, caller, items, semantic, base_url(request)))


def _complete(defaults: EvaluationItem, item: EvaluationItem) -> EvaluationIn:
    """An evaluation with the request's top-level values where it has none of its own."""
    merged = {
        name: getattr(item, name) if getattr(item, name) is not None else getattr(defaults, name)
        for name in ("subject", "action", "resource", "context")
    }
    missing = [n for n in ("subject", "action", "resource") if merged[n] is None]
    if missing:
        raise Rejection(
            Code.INVALID_REQUEST, f"an evaluation has no {', '.join(missing)} (nor a default)"
        )
    return EvaluationIn.model_validate(merged)
