"""The webhook channel: a notice POSTed to one endpoint, signed per Standard Webhooks."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
from standardwebhooks.webhooks import Webhook

from callgate.adapters.notify.deliveries import Clock, DeliveryError
from callgate.config.sections import WebhookSettings
from callgate.domain.notices import (
    Notice,
)


class WebhookTarget:
    """POSTs the notice to one endpoint, signed per Standard Webhooks."""

    def __init__(self, conf: WebhookSettings, timeout_s: float, clock: Clock) -> None:
        self.name = conf.url
        self.events: frozenset[str] = frozenset(conf.events)
        self.tenants = frozenset(conf.tenants)
        self._url = conf.url
        self._webhook = Webhook(conf.secret)
        self._timeout = timeout_s
        self._clock = clock

    def send(self, notice: Notice) -> None:
        now = self._clock()
        payload = notice.payload(now)
        at = datetime.fromtimestamp(now // 1000, UTC)
        headers = {
            "content-type": "application/json",
            "webhook-id": notice.message_id,
            "webhook-timestamp": str(now // 1000),
            "webhook-signature": self._webhook.sign(notice.message_id, at, payload),
        }
        try:
            response = httpx.post(
                self._url, content=payload.encode(), headers=headers, timeout=self._timeout
            )
        except httpx.HTTPError as exc:
            raise DeliveryError(str(exc) or type(exc).__name__) from None
        if not 200 <= response.status_code < 300:
            raise DeliveryError(f"HTTP {response.status_code}")
