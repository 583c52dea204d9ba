"""``/v1/usage``: each limit's usage per scope (ADR 0079), the session's tenant only; an
operator's session sees every tenant (``callgate usage``)."""

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
    sess: SessionDep, ctx: ContextDep, limit: str | None = Query(None, max_length=128)
) -> Any:
    return ctx.gateway.usage(sess.token, limit)
