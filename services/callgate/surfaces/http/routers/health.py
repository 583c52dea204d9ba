"""``/healthz`` (the process answers), ``/readyz`` (it can serve), ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from callgate.surfaces.http.deps import ContextDep
from callgate.surfaces.http.models import Health

router = APIRouter(tags=["operations"])


@router.get("/healthz", operation_id="healthz", response_model=Health)
def healthz() -> Any:
    return {"status": "ok"}


@router.get(
    "/readyz",
    operation_id="readyz",
    response_model=Health,
    responses={503: {"model": Health, "description": "not ready, with the reason"}},
)
def readyz(ctx: ContextDep) -> Any:
    reason = ctx.stats.not_ready()
    if reason is not None:
        return JSONResponse({"status": "not_ready", "reason": reason}, status_code=503)
    return {"status": "ready"}


@router.get(
    "/metrics",
    operation_id="metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def metrics(ctx: ContextDep) -> Response:
    ctx.metrics.observe_outcomes()  # the held calls that ended since the last scrape
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)
