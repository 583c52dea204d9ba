"""What the routes of one running server share: the gateway, options, feed and metrics."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from callgate.application.client import Gateway
from callgate.domain.identity import SessionVerifier
from callgate.surfaces.http.metrics import ApiMetrics, PendingSource, ServiceStats

__all__ = ["HttpOptions", "PendingSource", "ServerContext", "ServiceStats"]


class HttpOptions(BaseModel):
    """The HTTP surface's own settings (``callgate serve --http``; env ``CALLGATE_HTTP_*``)."""

    model_config = ConfigDict(frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    # How long POST /v1/proposals waits for a decision before answering 202.
    propose_wait_s: float = Field(default=10.0, gt=0, le=60)
    # How long approve/deny wait for the decider's answer before 504 timeout.
    decide_wait_s: float = Field(default=30.0, gt=0, le=120)
    # The longest a GET /v1/invocations/{id}?wait= long-poll or its event stream is held
    # open (ADR 0029); past it the answer is the current state, and the client asks again.
    hold_s: float = Field(default=300.0, gt=0, le=3600)
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    # Token bucket per client (bearer token, else address): sustained rate and burst.
    rate_per_s: float = Field(default=50.0, gt=0)
    rate_burst: int = Field(default=100, ge=1)
    # Origins allowed to call the API from a browser; empty: CORS closed.
    cors_origins: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, bind: str, environ: Mapping[str, str] | None = None) -> HttpOptions:
        """``HOST:PORT`` from the flag; limits from ``CALLGATE_HTTP_*`` when set."""
        env = os.environ if environ is None else environ
        host, sep, port = bind.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"--http wants HOST:PORT, got {bind!r}")
        values: dict[str, object] = {"host": host.strip("[]"), "port": int(port)}
        for name, field_name in _ENV.items():
            if (raw := env.get(f"CALLGATE_HTTP_{name}")) is not None:
                values[field_name] = raw
        if (raw := env.get("CALLGATE_HTTP_CORS_ORIGINS")) is not None:
            values["cors_origins"] = tuple(o for o in raw.split(",") if o)
        return cls.model_validate(values)


_ENV = {
    "PROPOSE_WAIT_S": "propose_wait_s",
    "DECIDE_WAIT_S": "decide_wait_s",
    "HOLD_S": "hold_s",
    "MAX_BODY_BYTES": "max_body_bytes",
    "RATE_PER_S": "rate_per_s",
    "RATE_BURST": "rate_burst",
}


@dataclass
class ServerContext:
    gateway: Gateway
    options: HttpOptions
    stats: ServiceStats
    feed: PendingSource
    metrics: ApiMetrics
    # The surface's own verifier (its cache is not shared with the runner's decider) and
    # the lock it and ``published`` need, since routes run on a thread pool.
    verifier: SessionVerifier
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Invocations answered 202: id -> tenant, until their status shows (bounded).
    published: OrderedDict[str, str] = field(default_factory=OrderedDict)
    # The providers the console signs approvers in with (OpenID Connect; ADR 0031).
    sign_in: Sequence[SignIn] = ()
    # Slack's interaction requests (``[slack]``; ADR 0032), None when not configured.
    slack: SlackBridge | None = None
    # ARAP callbacks to registered webhooks (ADR 0090), None without a notifier.
    callbacks: CallbackDesk | None = None

    MAX_PUBLISHED = 10_000

    def remember(self, invocation_id: str, tenant: str) -> None:
        with self.lock:
            self.published[invocation_id] = tenant
            while len(self.published) > self.MAX_PUBLISHED:
                self.published.popitem(last=False)

    def published_by(self, invocation_id: str) -> str | None:
        with self.lock:
            return self.published.get(invocation_id)


class SignIn(Protocol):
    """One OpenID Connect provider (``callgate.adapters.oidc.OidcSignIn``)."""

    index: int
    issuer: str
    name: str

    def begin(self) -> tuple[str, Any]:
        """The provider's authorization URL and the transaction the browser keeps."""
        ...

    def finish(self, tx: Any, params: Mapping[str, str]) -> str:
        """The ID token for the callback's parameters (``SignInError`` otherwise)."""
        ...


class CallbackDesk(Protocol):
    """``adapters.notify.callbacks.AccessRequestCallbacks``: the registered callback URLs."""

    def target_for(self, endpoint: str, tenant: str) -> object | None: ...

    def register(
        self, task: Mapping[str, Any], tenant: str, callback: Mapping[str, Any]
    ) -> None: ...


class SlackBridge(Protocol):
    """``adapters.notify.slack.SlackInteractions``: Slack's signature, the mapping."""

    def verify(self, body: bytes, timestamp: str | None, signature: str | None) -> None: ...

    def session_for(self, action: Any) -> tuple[Any, str]:
        """The mapped identity and a short-lived session token of it."""
        ...
