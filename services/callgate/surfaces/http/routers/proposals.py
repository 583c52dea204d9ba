"""``POST /v1/proposals``: an agent platform proposes a tool call (C1)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse

from callgate.domain.codes import Code
from callgate.surfaces.http.deps import ContextDep, SessionDep
from callgate.surfaces.http.errors import STATUS, retry_after
from callgate.surfaces.http.models import (
    COMMON,
    AnswerOrError,
    ProposalIn,
    ProposeAnswer,
    errors,
)
from callgate.surfaces.render import answer_value

router = APIRouter(prefix="/v1/proposals", tags=["proposals"])


@router.post(
    "",
    operation_id="propose",
    summary="Propose a tool call and wait (bounded) for its decision",
    response_model=None,
    responses={
        200: {"model": ProposeAnswer, "description": "decided: the `callgate propose` answer"},
        **{
            status: {
                "model": ProposeAnswer,
                "description": "decided, refused: the answer, whose `error` has the code",
            }
            for status in (403, 404, 409, 502)
        },
        202: {
            "model": ProposeAnswer,
            "description": "not decided within the wait: poll the invocation (`Location`)",
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        **errors(*COMMON),
        422: {
            "model": AnswerOrError,
            "description": "refused arguments (the answer) or a malformed request (an error)",
        },
    },
)
def propose(
    body: ProposalIn,
    sess: SessionDep,
    ctx: ContextDep,
    idempotency_key: Annotated[
        str | None,
        Header(alias="Idempotency-Key", min_length=1, max_length=255),
    ] = None,
    wait: Annotated[
        float | None, Query(gt=0, le=60, description="seconds to wait (server default)")
    ] = None,
    traceparent: Annotated[
        str | None,
        Header(
            max_length=55,
            description="the caller's W3C trace context: the call's span continues it",
        ),
    ] = None,
) -> JSONResponse:
    """The same call as ``callgate propose``: its answer, with the outcome's HTTP status."""
    timeout = min(wait or ctx.options.propose_wait_s, ctx.options.propose_wait_s)
    started = time.monotonic()
    proposed_at_ms = time.time_ns() // 1_000_000
    answer: dict[str, Any] = ctx.gateway.propose(
        sess.token,
        body.tool,
        body.args,
        idempotency_key=idempotency_key,
        approval_id=body.approval_id,
        timeout_s=timeout,
        traceparent=traceparent,
    )
    if answer.get("invocation_id"):
        ctx.metrics.proposed(str(answer["invocation_id"]), body.tool, proposed_at_ms)
    if answer.get("settled"):
        ctx.metrics.latency.labels(tool=body.tool).observe(time.monotonic() - started)
        return JSONResponse(
            answer_value(answer),
            status_code=STATUS[Code(answer["outcome"])],
            headers=retry_after(answer),
        )
    ctx.remember(answer["invocation_id"], sess.tenant)
    where = f"/v1/invocations/{answer['invocation_id']}"
    return JSONResponse(answer_value(answer), status_code=202, headers={"Location": where})
