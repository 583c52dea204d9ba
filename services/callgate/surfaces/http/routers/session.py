"""``/v1/session``: who the bearer is (the console shows it after sign-in)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from callgate.surfaces.http.deps import SessionDep
from callgate.surfaces.http.models import COMMON, SessionInfo, errors

router = APIRouter(prefix="/v1/session", tags=["session"])


@router.get(
    "",
    operation_id="getSession",
    summary="The verified session of the bearer",
    response_model=SessionInfo,
    responses=errors(*COMMON),
)
def get_session(sess: SessionDep) -> Any:
    p = sess.principal
    return {"user": p.user, "tenant": p.tenant, "roles": list(p.roles), "expires_at": p.expires_at}
