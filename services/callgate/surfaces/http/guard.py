"""The surface's own protections, as ASGI middleware around every route.

- security headers on every response: a Content-Security-Policy that allows scripts
  and styles from this origin only (no inline script), ``nosniff``, no framing, no
  referrer, no caching of API answers;
- a request body limit: a declared ``Content-Length`` over the limit, or a body that
  grows past it, is ``413 payload_too_large`` before any route runs;
- a rate limit on ``/v1`` and AuthZEN's ``/access/`` (ADR 0083): token buckets per
  bearer token and per address (four times larger); an empty bucket is
  ``429 rate_limited`` with ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from callgate.domain.codes import Code
from callgate.surfaces.http.errors import AUTHZEN_PREFIX, error_response

# The API's routes: rate limited, never cached.
API_PREFIXES = ("/v1", AUTHZEN_PREFIX)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
)


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = scope["path"].startswith(API_PREFIXES)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in {name for name, _ in HEADERS}
                ]
                headers += list(HEADERS)
                if api:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _TooLarge(StarletteHTTPException):
    """Raised while a route reads the body; FastAPI passes HTTP exceptions through."""

    def __init__(self) -> None:
        super().__init__(413, "request body too large")


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = self.max_bytes + 1
                if declared > self.max_bytes:
                    await self._refuse(scope, receive, send)
                    return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"request body over {self.max_bytes} bytes"
        await error_response(Code.PAYLOAD_TOO_LARGE, message)(scope, receive, send)


class RateLimit:
    """Token buckets per bearer token and per address; idle buckets are forgotten.

    A request takes from both: its bearer's bucket (``rate``, ``burst``) and its
    address's, which is ``ADDRESS_FACTOR`` times larger, so several sessions behind one
    address share it while made-up tokens from one address cannot dodge the limit.
    """

    MAX_CLIENTS = 10_000
    ADDRESS_FACTOR = 4

    def __init__(self, app: ASGIApp, rate_per_s: float, burst: int) -> None:
        self.app = app
        self.rate = rate_per_s
        self.burst = float(burst)
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _clients(scope: Scope) -> list[tuple[str, int]]:
        """The buckets a request takes from, each with its size factor."""
        client = scope.get("client")
        found = [(f"a:{client[0] if client else '-'}", RateLimit.ADDRESS_FACTOR)]
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                found.append(("t:" + hashlib.sha256(value).hexdigest()[:32], 1))
        return found

    def take(self, client: str, now: float, factor: int = 1) -> float:
        """0 when a request may pass, else the seconds until one may."""
        rate, burst = self.rate * factor, self.burst * factor
        with self._lock:
            tokens, last = self._buckets.pop(client, (burst, now))
            tokens = min(burst, tokens + (now - last) * rate)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / rate
            self._buckets[client] = (tokens, now)
            while len(self._buckets) > self.MAX_CLIENTS:
                self._buckets.popitem(last=False)
            return wait

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(API_PREFIXES):
            await self.app(scope, receive, send)
            return
        now = time.monotonic()
        wait = max(self.take(key, now, factor) for key, factor in self._clients(scope))
        if wait > 0:
            retry = str(max(1, math.ceil(wait)))
            response = error_response(
                Code.RATE_LIMITED, "too many requests; retry later", {"Retry-After": retry}
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
