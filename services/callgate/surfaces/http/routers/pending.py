"""``/v1/pending``: the tenant's pending approvals, as a list and as an event stream.

The stream is ``text/event-stream``: an ``event: pending`` whose data is the tenant's
whole pending list, first on connect and then whenever it changes; a comment line every
15 s keeps proxies from closing an idle stream. It ends when the session expires. A
browser reads it with ``fetch`` (``EventSource`` cannot send an ``Authorization``
header, and tokens travel in no other way).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from callgate.surfaces.http.deps import ContextDep, SessionDep
from callgate.surfaces.http.models import COMMON, PendingItem, errors

router = APIRouter(prefix="/v1/pending", tags=["pending"])

HEARTBEAT_S = 15.0
POLL_S = 0.1


@router.get(
    "",
    operation_id="listPending",
    summary="The tenant's pending approvals (`callgate pending --session`)",
    response_model=list[PendingItem],
    responses=errors(*COMMON),
)
def list_pending(sess: SessionDep, ctx: ContextDep) -> Any:
    return [r for r in ctx.gateway.pending(sess.token) if r.get("tenant") == sess.tenant]


@router.get(
    "/events",
    operation_id="streamPending",
    summary="Server-sent events: the tenant's pending approvals whenever they change",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}},
        **errors(*COMMON),
    },
)
def stream_pending(request: Request, sess: SessionDep, ctx: ContextDep) -> StreamingResponse:
    feed, tenant = ctx.feed, sess.tenant
    expires_s = sess.principal.expires_at / 1000 if sess.principal.expires_at else None

    def snapshot() -> list[dict[str, Any]]:
        return [r for r in feed.rows() if r.get("tenant") == tenant]

    async def events() -> AsyncIterator[str]:
        sent: list[dict[str, Any]] | None = None
        seen = -1
        quiet_since = time.monotonic()
        while not await request.is_disconnected():
            if expires_s is not None and time.time() >= expires_s:
                yield "event: expired\ndata: {}\n\n"
                return
            if feed.version != seen:
                seen = feed.version
                rows = snapshot()
                if rows != sent:
                    sent = rows
                    quiet_since = time.monotonic()
                    yield f"event: pending\ndata: {json.dumps(rows, separators=(',', ':'))}\n\n"
            if time.monotonic() - quiet_since >= HEARTBEAT_S:
                quiet_since = time.monotonic()
                yield ": keep-alive\n\n"
            await asyncio.sleep(POLL_S)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
