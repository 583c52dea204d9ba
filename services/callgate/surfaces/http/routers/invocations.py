"""``/v1/invocations/{id}``: an invocation's status, and the approver's approve or deny.

An invocation of another tenant answers exactly as one that does not exist
(``404 not_found``), so a bearer learns nothing about other tenants' calls.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query
from fastapi.responses import StreamingResponse

from callgate.application.answers import is_final, undecided
from callgate.domain.codes import Code
from callgate.surfaces.http.context import ServerContext
from callgate.surfaces.http.deps import ContextDep, Session, SessionDep
from callgate.surfaces.http.errors import ApiError
from callgate.surfaces.http.models import COMMON, Approved, Denied, DenyIn, Status, errors

router = APIRouter(prefix="/v1/invocations", tags=["invocations"])

InvocationId = Annotated[str, Path(min_length=1, max_length=200)]


def visible_status(ctx: ServerContext, invocation_id: str, sess: Session) -> dict[str, Any]:
    """The status of an invocation of the bearer's tenant, else ``404 not_found``.

    An invocation this server answered ``202`` and the decider has not reached yet is
    ``pending_decision`` (not settled), as the SDK's answer says: not missing, and never
    ``allowed``, which says that a policy permitted it.
    """
    status = ctx.gateway.status_or_undecided(invocation_id, sess.token)
    if status is None and ctx.published_by(invocation_id) == sess.tenant:
        return undecided(invocation_id)
    if status is not None and status.get("outcome") == Code.PENDING_DECISION.value:
        return status  # bound to this bearer's token (``Gateway.status``)
    if status is None or status.get("tenant") != sess.tenant:
        raise ApiError(Code.NOT_FOUND, f"no invocation {invocation_id}")
    return status


@router.get(
    "/{invocation_id}",
    operation_id="getInvocation",
    summary="An invocation's status (`callgate status`)",
    response_model=Status,
    responses=errors(*COMMON, 404),
)
def get_invocation(
    invocation_id: InvocationId,
    sess: SessionDep,
    ctx: ContextDep,
    wait: Annotated[
        float | None,
        Query(gt=0, le=3600, description="long-poll: seconds to wait for the final outcome"),
    ] = None,
) -> Any:
    """With ``wait``, held until the invocation is final (ADR 0029: executed, failed,
    its approval denied or expired) or the wait (at most ``hold_s``) runs out; ``final``
    says which."""
    status = visible_status(ctx, invocation_id, sess)
    if wait is None:
        return status
    ctx.gateway.wait(invocation_id, sess.token, min(wait, ctx.options.hold_s))
    status = visible_status(ctx, invocation_id, sess)
    return {**status, "final": is_final(status)}


@router.get(
    "/{invocation_id}/events",
    operation_id="streamInvocation",
    summary="Server-sent events: the invocation's status at each change, until final",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "`status` events"},
        **errors(*COMMON, 404),
    },
)
def stream_invocation(
    invocation_id: InvocationId,
    sess: SessionDep,
    ctx: ContextDep,
    wait: Annotated[float | None, Query(gt=0, le=3600)] = None,
) -> StreamingResponse:
    """One ``status`` event per change of the status value (the same value as GET), the
    last one ``final`` or at the end of the hold; a comment line every 15 s keeps proxies
    from closing the stream."""
    visible_status(ctx, invocation_id, sess)
    hold = min(wait or ctx.options.hold_s, ctx.options.hold_s)

    def events() -> Iterator[str]:
        deadline = time.monotonic() + hold
        last: dict[str, Any] | None = None
        beat = time.monotonic()
        while True:
            try:
                status = visible_status(ctx, invocation_id, sess)
            except ApiError:
                return
            final = is_final(status)
            if status != last:
                last = status
                body = json.dumps({**status, "final": final}, sort_keys=True)
                yield f"event: status\ndata: {body}\n\n"
                beat = time.monotonic()
            if final or time.monotonic() >= deadline:
                return
            if time.monotonic() - beat > 15:
                beat = time.monotonic()
                yield ": waiting\n\n"
            time.sleep(0.2)  # each read above is one view lookup

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@router.post(
    "/{invocation_id}/approve",
    operation_id="approveInvocation",
    summary="Approve a pending call (`callgate approve`)",
    response_model=Approved,
    response_model_exclude_none=True,
    responses=errors(*COMMON, 403, 404, 409, 504),
)
def approve(invocation_id: InvocationId, sess: SessionDep, ctx: ContextDep) -> Any:
    visible_status(ctx, invocation_id, sess)
    d = ctx.gateway.approve(invocation_id, sess.token, ctx.options.decide_wait_s)
    keys = ("approval_id", "invocation_id", "expires_at", "outcome", "granted", "required")
    return {k: d[k] for k in keys if k in d}


@router.post(
    "/{invocation_id}/deny",
    operation_id="denyInvocation",
    summary="Deny a pending call (`callgate deny`)",
    response_model=Denied,
    responses=errors(*COMMON, 403, 404, 409, 504),
)
def deny(
    invocation_id: InvocationId,
    sess: SessionDep,
    ctx: ContextDep,
    body: Annotated[DenyIn | None, Body()] = None,
) -> Any:
    visible_status(ctx, invocation_id, sess)
    reason = body.reason if body is not None else ""
    d = ctx.gateway.deny(invocation_id, sess.token, reason, ctx.options.decide_wait_s)
    return {"invocation_id": d["invocation_id"], "denied": True, "reason": d.get("reason", "")}
