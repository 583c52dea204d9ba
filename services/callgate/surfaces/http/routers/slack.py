"""``POST /v1/slack/interactions``: an approver's Approve or Deny click in Slack (ADR 0032).

The request must be signed by Slack's signing secret within five minutes (``401
unauthenticated`` otherwise); the clicking Slack user must be mapped to a callgate
identity in ``[[slack.users]]`` (``403 approver_forbidden`` otherwise). Then the click is
the approval API's approve or deny, by that identity: callgate's own checks (approver
roles, separation of duties, tenant) decide, as for the console; channel membership
grants nothing.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from callgate.domain.codes import Code, Rejection
from callgate.domain.limits import parse_json
from callgate.domain.notices import slack_action
from callgate.surfaces.http.deps import ContextDep, Session
from callgate.surfaces.http.errors import ApiError
from callgate.surfaces.http.models import SlackDecision, errors
from callgate.surfaces.http.routers.invocations import visible_status
from callgate.surfaces.strict_body import ENVELOPE_MAX_DEPTH, read_form

router = APIRouter(prefix="/v1/slack", tags=["slack"])
# Slack's interaction form has one field (``payload``); a few more are tolerated.
SLACK_MAX_FIELDS = 8


@router.post(
    "/interactions",
    operation_id="slackInteraction",
    summary="Slack's interaction request: an Approve or Deny click (signed by Slack)",
    response_model=SlackDecision,
    responses=errors(401, 403, 404, 409, 413, 422, 429, 500, 504),
)
async def interactions(request: Request, ctx: ContextDep) -> Any:
    if ctx.slack is None:
        raise ApiError(Code.NOT_FOUND, "Slack is not configured ([slack] in callgate.toml)")
    body = await request.body()
    headers = request.headers
    ctx.slack.verify(
        body, headers.get("X-Slack-Request-Timestamp"), headers.get("X-Slack-Signature")
    )
    payload = _payload(body)
    action = slack_action(payload) if isinstance(payload, dict) else None
    if action is None:
        raise ApiError(Code.INVALID_REQUEST, "not a callgate Approve or Deny click")
    _, token = ctx.slack.session_for(action)
    return await run_in_threadpool(_decide, ctx, action, token)


def _payload(body: bytes) -> Any:
    """The form's one ``payload`` field, read strictly: the form itself (``read_form``:
    UTF-8, no field twice) and the JSON in it (``parse_json``: no duplicate key,
    non-finite number or lone surrogate, nested at most as deep as an envelope)."""
    try:
        fields = read_form(body, SLACK_MAX_FIELDS)
    except ValueError as exc:
        raise ApiError(Code.INVALID_REQUEST, f"not a Slack interaction form: {exc}") from None
    if "payload" not in fields:
        raise ApiError(Code.INVALID_REQUEST, "not a Slack interaction (form field payload)")
    try:
        return parse_json(fields["payload"], max_depth=ENVELOPE_MAX_DEPTH)
    except Rejection as r:
        message = r.message.replace("arguments", "Slack payload", 1)
        raise ApiError(Code.INVALID_REQUEST, message) from None


def _decide(ctx: Any, action: Any, token: str) -> dict[str, Any]:
    app = ctx.gateway.app
    with ctx.lock:
        principal = ctx.verifier.verify(token, app.clock())
    visible_status(ctx, action.invocation_id, Session(token, principal))
    wait = ctx.options.decide_wait_s
    if action.decision == "grant":
        done = ctx.gateway.approve(action.invocation_id, token, wait)
        return {
            "invocation_id": action.invocation_id,
            "decision": "granted",
            "approver": principal.user,
            "approval_id": done.get("approval_id"),
        }
    ctx.gateway.deny(action.invocation_id, token, "denied in Slack", wait)
    return {"invocation_id": action.invocation_id, "decision": "denied", "approver": principal.user}
