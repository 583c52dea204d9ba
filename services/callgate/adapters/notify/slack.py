"""The Slack channel: an interactive message per pending item, replaced once it is decided;
and the interactions Slack sends back (its signature checked, its user mapped to the
callgate identity they act as).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier

from callgate.adapters.notify.deliveries import Clock, DeliveryError
from callgate.config.sections import SlackSettings, SlackUser
from callgate.domain.codes import Code, Rejection
from callgate.domain.identity import SessionIssuer
from callgate.domain.notices import (
    DECIDED,
    PENDING,
    Notice,
    SlackAction,
    slack_decided,
    slack_pending,
)


class SlackTarget:
    """Posts an interactive message per pending item; replaces it once it is decided."""

    name = "slack"
    events: frozenset[str] = frozenset({PENDING, DECIDED})
    tenants: frozenset[str] = frozenset()  # each tenant's channel: ``_channel_of``

    def __init__(self, conf: SlackSettings, timeout_s: float) -> None:
        base = conf.api_url if conf.api_url.endswith("/") else conf.api_url + "/"
        self._client = WebClient(token=conf.bot_token, base_url=base, timeout=int(timeout_s))
        self._channel = conf.channel
        self._tenant_channels = dict(conf.tenant_channels)
        self._posted: dict[str, tuple[str, str]] = {}  # invocation -> (channel, ts)
        self._lock = threading.Lock()

    def _channel_of(self, tenant: str) -> str | None:
        return self._tenant_channels.get(tenant, self._channel)

    def send(self, notice: Notice) -> None:
        with self._lock:
            posted = self._posted.get(notice.invocation_id)
        try:
            if notice.kind == PENDING:
                channel = self._channel_of(notice.tenant)
                if channel is None:
                    return  # no channel for this tenant: Slack is not told
                text, blocks = slack_pending(notice)
                answer = self._client.chat_postMessage(channel=channel, text=text, blocks=blocks)
                with self._lock:
                    self._posted[notice.invocation_id] = (
                        str(answer.get("channel") or channel),
                        str(answer.get("ts")),
                    )
                return
            text, blocks = slack_decided(notice)
            if posted is not None:
                self._client.chat_update(channel=posted[0], ts=posted[1], text=text, blocks=blocks)
                with self._lock:
                    self._posted.pop(notice.invocation_id, None)
            elif (channel := self._channel_of(notice.tenant)) is not None:
                self._client.chat_postMessage(channel=channel, text=text, blocks=blocks)
        except SlackApiError as exc:
            raise DeliveryError(f"Slack answered {exc.response.get('error')!r}") from None


# Slack's own limit: a request older (or newer) than this is refused (replay protection).
SLACK_MAX_AGE_S = 300
SLACK_TOKEN_TTL_S = 120


class SlackInteractions:
    """Verifies an interaction request as Slack signs it and names the callgate identity
    its clicking user acts as. Decides nothing: callgate's approval checks do."""

    def __init__(self, conf: SlackSettings, issuer: SessionIssuer, clock: Clock) -> None:
        assert conf.signing_secret is not None
        self._verifier = SignatureVerifier(conf.signing_secret)
        self._users: Mapping[str, SlackUser] = {u.slack_user: u for u in conf.users}
        self._team = conf.team_id
        self._issuer = issuer
        self._clock = clock

    def verify(self, body: bytes, timestamp: str | None, signature: str | None) -> None:
        """Raise ``Rejection(UNAUTHENTICATED)`` unless Slack signed ``body`` recently."""
        if not timestamp or not signature:
            raise Rejection(Code.UNAUTHENTICATED, "a Slack request needs its signature headers")
        try:
            age = abs(self._clock() / 1000 - int(timestamp))
        except ValueError:
            raise Rejection(
                Code.UNAUTHENTICATED, "X-Slack-Request-Timestamp is not a number"
            ) from None
        if age > SLACK_MAX_AGE_S:
            raise Rejection(
                Code.UNAUTHENTICATED, f"the Slack request timestamp is {int(age)} s old (over 300)"
            )
        try:  # Slack sends UTF-8; ``slack_sdk`` would raise on anything else
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise Rejection(Code.INVALID_REQUEST, "the Slack request body is not UTF-8") from None
        if not self._verifier.is_valid(text, timestamp, signature):
            raise Rejection(Code.UNAUTHENTICATED, "the Slack request signature does not verify")

    def session_for(self, action: SlackAction) -> tuple[SlackUser, str]:
        """The mapped identity and a short-lived session token of it (issuer
        ``callgate-slack``), or ``Rejection(APPROVER_FORBIDDEN)`` for an unmapped user."""
        if self._team is not None and action.team != self._team:
            raise Rejection(Code.APPROVER_FORBIDDEN, "the Slack request comes from another team")
        user = self._users.get(action.slack_user)  # exact: a Slack user id, as configured
        if user is None:
            raise Rejection(
                Code.APPROVER_FORBIDDEN,
                f"Slack user {action.slack_user} is not mapped to a callgate identity",
            )
        token = self._issuer.issue(
            user.user, user.tenant, list(user.roles), self._clock(), ttl_seconds=SLACK_TOKEN_TTL_S
        )
        return user, token
