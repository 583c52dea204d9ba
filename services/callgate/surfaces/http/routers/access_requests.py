"""ARAP's access request and task status endpoints (ADR 0090): a thin translation onto the
SDK, as the evaluation endpoints are (ADR 0083).

A PEP (``callgate-pep``) submits an access request for a requestable denial: an
evaluation whose outcome was ``approval_required``, named by ``denial.evaluation_id`` (its
invocation id; callgate issues no ``binding_token``). The request is bound to that
recorded evaluation: formed with the very subject token forwarded again (its id is bound
to it), of the same tool, target and arguments (the audit's ``args_hash``), within
``REQUESTABLE_S`` of its decision. It is then decided again by the decider and, when it
still needs a confirmation, its approval is requested as for any call (the tool's
approvers, quorum and dry-run): ``Gateway.request_access``. The task is that invocation;
its status is the status view's approval; an approved task's result is the approval
artifact, which a re-evaluation presents at ``context.approval``. A callback goes to a
webhook registered for ``access_request.decided`` (``adapters/notify/callbacks.py``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from callgate.domain.access_requests import (
    CALLBACK_EVENTS,
    EXPIRED_DENIAL,
    INVALID_DENIAL_BINDING,
    NOT_REQUESTABLE,
    PENDING,
    REQUESTABLE_S,
    TASK_PREFIX,
    UNKNOWN_TASK,
    approval_result,
    parse_rfc3339,
    rfc3339,
    task_status,
)
from callgate.domain.approvals import peek_claim
from callgate.domain.arguments import normalize_args
from callgate.domain.canonical import args_hash, canonical_json
from callgate.domain.codes import Code, Rejection
from callgate.domain.principal import Principal
from callgate.domain.scope import is_bound
from callgate.surfaces.http.context import ServerContext
from callgate.surfaces.http.deps import ContextDep
from callgate.surfaces.http.errors import Problem
from callgate.surfaces.http.models import errors
from callgate.surfaces.http.routers.authzen import (
    REQUESTS_PATH,
    Action,
    PepDep,
    Resource,
    Subject,
    _call,
    _Entity,
    _request_id,
    _subject_session,
    base_url,
    presented,
)

router = APIRouter(tags=["authzen"])

TASK_PATH = REQUESTS_PATH + "/{task_id}"


class Denial(_Entity):
    """The denial the request remedies: callgate binds it by ``evaluation_id``."""

    evaluation_id: str | None = Field(default=None, min_length=1, max_length=400)
    binding_token: str | None = Field(default=None, max_length=8192)
    expires_at: str = Field(min_length=1, max_length=64)
    evaluated_at: str | None = Field(default=None, max_length=64)
    reason: str | None = Field(default=None, max_length=200)
    template: str | None = Field(default=None, max_length=200)


class Callback(_Entity):
    endpoint: str = Field(min_length=1, max_length=2048, description="a registered webhook URL")
    state: str | None = Field(default=None, max_length=1024)
    events: list[str] | None = Field(default=None, max_length=6)


class AccessRequestIn(_Entity):
    subject: Subject
    resource: Resource | None = None
    action: Action | None = None
    items: list[Any] | None = Field(default=None, description="bulk requests: not implemented")
    context: dict[str, Any] | None = Field(
        default=None, description="the denied evaluation's context (the tool's other arguments)"
    )
    denial: Denial | None = None
    requested_access: dict[str, Any] | None = Field(default=None, description="not read")
    callback: Callback | None = None
    client: dict[str, Any] | None = Field(default=None, description="not read")


class Task(BaseModel):
    id: str
    status: str
    status_endpoint: str
    expires_at: str | None = None


class TaskOut(BaseModel):
    task: Task
    result: dict[str, Any] | None = None


def _bound(
    ctx: ServerContext,
    caller: Principal,
    denial: Denial,
    session: str,
    tool: str,
    args: dict[str, Any],
) -> None:
    """The submission is the recorded requestable denial's call, still fresh; the
    profile's problems otherwise (``invalid_denial_binding``, ``not_requestable``,
    ``expired_denial``)."""
    evaluation_id = denial.evaluation_id
    if evaluation_id is None:
        raise Problem(
            INVALID_DENIAL_BINDING,
            Code.INVALID_REQUEST,
            "denial.evaluation_id: callgate binds a request to its evaluation's id "
            "(it issues no binding_token)",
        )
    if parse_rfc3339(denial.expires_at) is None:
        raise Rejection(Code.INVALID_REQUEST, "denial.expires_at: an RFC 3339 time")
    status = ctx.gateway.status_for(evaluation_id, caller)
    if (
        status is None
        or evaluation_id.startswith(TASK_PREFIX)
        or status.get("approval") is not None
        or not is_bound(evaluation_id, session)
    ):
        raise Problem(
            INVALID_DENIAL_BINDING,
            Code.INVALID_REQUEST,
            "denial.evaluation_id: no evaluation of this subject's session by that id",
        )
    if status.get("outcome") != Code.APPROVAL_REQUIRED.value:
        raise Problem(
            NOT_REQUESTABLE,
            _code(status.get("outcome")),
            f"the evaluation was {status.get('outcome')}, not a requestable denial",
        )
    if status.get("tool") != tool or status.get("target") != _target_of(ctx, tool, args):
        raise Problem(
            INVALID_DENIAL_BINDING, Code.INVALID_REQUEST, "the action or resource is not the denied"
        )
    records = ctx.gateway.audit_for(evaluation_id, caller)
    if not records or records[-1].get("args_hash") != _args_hash(ctx, tool, args):
        raise Problem(
            INVALID_DENIAL_BINDING, Code.INVALID_REQUEST, "the context is not the denied one"
        )
    decided_at = int(status.get("updated_at") or 0)
    if ctx.gateway.app.clock() > decided_at + REQUESTABLE_S * 1000:
        raise Problem(
            EXPIRED_DENIAL,
            Code.INVALID_REQUEST,
            f"the requestable denial expired at {rfc3339(decided_at + REQUESTABLE_S * 1000)}",
        )


def _target_of(ctx: ServerContext, tool: str, args: dict[str, Any]) -> str:
    spec = ctx.gateway.app.profile.tool(tool)
    target = None if spec is None else spec.target_arg
    return "" if target is None else str(args.get(target, ""))


def _args_hash(ctx: ServerContext, tool: str, args: dict[str, Any]) -> str | None:
    """The hash the decider records for these arguments (None when they do not normalize:
    then they are not the denied evaluation's)."""
    spec = ctx.gateway.app.profile.tool(tool)
    if spec is None:
        return None
    try:
        limits = ctx.gateway.app.profile.entry_limits
        return args_hash(normalize_args(spec, limits, canonical_json(args)))
    except (Rejection, ValueError, TypeError):
        return None


def _code(outcome: object) -> Code:
    try:
        return Code(str(outcome))
    except ValueError:
        return Code.INTERNAL_ERROR


def _callback(ctx: ServerContext, caller: Principal, callback: Callback | None) -> None:
    """A callback only to a webhook registered for ``access_request.decided`` and this
    tenant (the profile's pre-registered endpoint): no PEP makes callgate post elsewhere."""
    if callback is None:
        return
    desk = ctx.callbacks
    if desk is None or desk.target_for(callback.endpoint, caller.tenant) is None:
        raise Rejection(
            Code.INVALID_REQUEST,
            "callback.endpoint: not a webhook registered for access_request.decided "
            "([notify] webhooks) for this tenant",
        )
    unknown = sorted(set(callback.events or ()) - CALLBACK_EVENTS)
    if unknown:
        raise Rejection(Code.INVALID_REQUEST, f"callback.events: unknown {', '.join(unknown)}")


def _task(base: str, task_id: str, status: dict[str, Any] | None) -> TaskOut:
    state = task_status(status) if status is not None else PENDING
    approval = (status or {}).get("approval") or {}
    expires = approval.get("expires_at")
    task = Task(
        id=task_id,
        status=state,
        status_endpoint=base + REQUESTS_PATH + "/" + task_id,
        expires_at=rfc3339(expires) if state == PENDING and isinstance(expires, int) else None,
    )
    artifact = approval.get("approval_id")
    jti = peek_claim(artifact, "jti") if isinstance(artifact, str) else None
    result = approval_result(status or {}, jti) if jti is not None else None
    return TaskOut(task=task, result=result)


@router.post(
    REQUESTS_PATH,
    operation_id="arapAccessRequest",
    summary="ARAP access request: a requestable denial's approval asked for (PEPs)",
    status_code=202,
    response_model=TaskOut,
    response_model_exclude_none=True,
    responses=errors(400, 401, 403, 410, 413, 429, 500),
)
def submit(
    body: AccessRequestIn, request: Request, response: Response, caller: PepDep, ctx: ContextDep
) -> TaskOut:
    _request_id(request, response)
    if body.items is not None:
        raise Rejection(Code.INVALID_REQUEST, "items: bulk access requests are not implemented")
    if body.resource is None or body.action is None:
        raise Rejection(Code.INVALID_REQUEST, "resource and action: the denied evaluation's")
    if body.denial is None:
        raise Problem(INVALID_DENIAL_BINDING, Code.INVALID_REQUEST, "denial: required")
    session = _subject_session(ctx, caller, body.subject)
    args, approval = presented(body.context)
    if approval is not None:
        raise Rejection(Code.INVALID_REQUEST, "context.approval: an access request presents none")
    tool, args = _call(ctx, body.action, body.resource, args)
    _bound(ctx, caller, body.denial, session, tool, args)
    _callback(ctx, caller, body.callback)
    answer = ctx.gateway.request_access(session, tool, args, ctx.options.propose_wait_s)
    outcome = answer.get("outcome")
    if outcome not in (Code.APPROVAL_REQUIRED.value, Code.PENDING_DECISION.value):
        message = (answer.get("error") or {}).get("message") or f"decided {outcome}"
        raise Problem(NOT_REQUESTABLE, _code(outcome), message)
    task_id = str(answer["invocation_id"])
    out = _task(base_url(request), task_id, ctx.gateway.answer_status(task_id))
    if body.callback is not None and ctx.callbacks is not None:
        ctx.callbacks.register(
            out.task.model_dump(), caller.tenant, body.callback.model_dump(exclude_none=True)
        )
    response.headers["Location"] = out.task.status_endpoint
    return out


@router.get(
    TASK_PATH,
    operation_id="arapTaskStatus",
    summary="ARAP task status: an access request's approval (PEPs of its tenant)",
    response_model=TaskOut,
    response_model_exclude_none=True,
    responses=errors(401, 403, 404, 429, 500),
)
def task(
    task_id: str, request: Request, response: Response, caller: PepDep, ctx: ContextDep
) -> TaskOut:
    _request_id(request, response)
    status = ctx.gateway.status_for(task_id, caller) if task_id.startswith(TASK_PREFIX) else None
    if status is None:
        raise Problem(UNKNOWN_TASK, Code.NOT_FOUND, "no such task for this PEP's tenant")
    return _task(base_url(request), task_id, status)
