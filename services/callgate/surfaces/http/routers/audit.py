"""``/v1/audit``: the tenant's audit records (C9) and the verification of their chains."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from callgate.surfaces.http.deps import ContextDep, SessionDep
from callgate.surfaces.http.models import COMMON, AuditRecord, Verified, errors

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get(
    "",
    operation_id="listAudit",
    summary="The tenant's audit records, of one invocation when given (`callgate audit`)",
    response_model=list[AuditRecord],
    responses=errors(*COMMON),
)
def list_audit(
    sess: SessionDep,
    ctx: ContextDep,
    invocation: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> Any:
    return ctx.gateway.audit(invocation, session=sess.token)


@router.get(
    "/verify",
    operation_id="verifyAudit",
    summary="Verify the hash chains that hold the tenant's records (`callgate audit verify`)",
    response_model=Verified,
    responses=errors(*COMMON),
)
def verify_audit(sess: SessionDep, ctx: ContextDep) -> Any:
    v = ctx.gateway.verify_audit(tenant=sess.tenant)
    return {"ok": v.ok, "records": v.records, "first_bad": v.first_bad, "reason": v.reason}
