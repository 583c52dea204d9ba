"""``/v1/usage``: each limit's usage per scope (ADR 0079), the session's tenant only; an
operator's session sees every tenant (``callgate usage``). ``actor`` and ``tool`` narrow it
to what a call would count in: the console's card beside a pending approval."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from callgate.surfaces.http.deps import ContextDep, SessionDep
from callgate.surfaces.http.models import COMMON, UsageItem, errors

router = APIRouter(prefix="/v1/usage", tags=["usage"])


@router.get(
    "",
    operation_id="listUsage",
    summary="Each limit's usage per scope (`callgate usage --session`)",
    response_model=list[UsageItem],
    responses=errors(*COMMON),
)
def list_usage(
    sess: SessionDep,
    ctx: ContextDep,
    limit: str | None = Query(None, max_length=128),
    actor: str | None = Query(
        None, max_length=128, description="only the scopes of this actor or of none (exact)"
    ),
    tool: str | None = Query(
        None,
        max_length=128,
        description="only the limits that cover this tool, as a call of it counts",
    ),
) -> Any:
    return ctx.gateway.usage(sess.token, limit, actor=actor, tool=tool)
