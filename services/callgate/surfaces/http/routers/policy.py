"""``/v1/policy``: the policy-version history and the shadow version's disagreements, an
operator's reads (``callgate policy history``, ``callgate policy shadow report``; ADR 0050)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from callgate.surfaces.http.deps import ContextDep, SessionDep
from callgate.surfaces.http.models import COMMON, PolicyHistory, ShadowReport, errors

router = APIRouter(prefix="/v1/policy", tags=["policy"])


@router.get(
    "/history",
    operation_id="policyHistory",
    summary="Published, activated and shadow versions with who, when, why "
    "(`callgate policy history`; operators)",
    response_model=PolicyHistory,
    responses=errors(*COMMON, 403),
)
def history(sess: SessionDep, ctx: ContextDep) -> Any:
    return ctx.gateway.policy_history(session=sess.token)


@router.get(
    "/shadow",
    operation_id="shadowReport",
    summary="Live decisions the shadow version decided otherwise "
    "(`callgate policy shadow report`; operators)",
    response_model=ShadowReport,
    responses=errors(*COMMON, 403),
)
def shadow(sess: SessionDep, ctx: ContextDep) -> Any:
    return ctx.gateway.shadow_report(session=sess.token)
