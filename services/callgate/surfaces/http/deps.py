"""Dependencies: the gateway of the running server and the caller's verified session.

The session is verified once per request here, with the same verifier the decider uses
(C6); a route receives the ``Session`` and scopes every read to its tenant. The token is
the ``Authorization: Bearer`` header's, else the console's session cookie's (the ID token
of an OpenID Connect sign-in, ADR 0031), never a query parameter. A state-changing
request signed in by the cookie must carry ``X-CSRF-Token`` equal to the CSRF cookie
(double submit), else ``403 csrf_failed`` before the route runs.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from callgate.application.client import Gateway
from callgate.domain.codes import Code, Rejection
from callgate.domain.principal import Principal
from callgate.surfaces.http.context import ServerContext

bearer = HTTPBearer(auto_error=False, description="A callgate session token")

# ``__Host-``: Secure, Path=/ and no Domain, so no other host (a sibling subdomain) can
# set or overwrite them (RFC 6265bis 4.1.3.2).
SESSION_COOKIE = "__Host-callgate-session"
CSRF_COOKIE = "__Host-callgate-csrf"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class Session:
    token: str
    principal: Principal
    # The CSRF token of a cookie session (None for a bearer token).
    csrf_token: str | None = None

    @property
    def tenant(self) -> str:
        return self.principal.tenant


def context(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.context
    return ctx


def gateway(ctx: Annotated[ServerContext, Depends(context)]) -> Gateway:
    return ctx.gateway


def check_csrf(request: Request) -> str:
    """The double-submitted CSRF token of a cookie session; ``403 csrf_failed`` unless a
    state-changing request's ``X-CSRF-Token`` equals the CSRF cookie."""
    expected = request.cookies.get(CSRF_COOKIE, "")
    if request.method in SAFE_METHODS:
        return expected
    sent = request.headers.get(CSRF_HEADER, "")
    if not expected or not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise Rejection(
            Code.CSRF_FAILED,
            f"a request signed in by the session cookie needs the {CSRF_HEADER} header"
            " (GET /v1/session gives it); nothing was done",
        )
    return expected


def session(
    request: Request,
    ctx: Annotated[ServerContext, Depends(context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Session:
    """The verified bearer or cookie session, or ``401 unauthenticated``."""
    csrf: str | None = None
    if credentials is not None and credentials.scheme.lower() == "bearer":
        token = credentials.credentials
    elif cookie := request.cookies.get(SESSION_COOKIE):
        csrf = check_csrf(request)  # before anything else: a forged request does nothing
        token = cookie
    else:
        raise Rejection(Code.UNAUTHENTICATED, "send Authorization: Bearer <session token>")
    app = ctx.gateway.app
    with ctx.lock:  # the verifier's cache is not thread-safe; routes run in threads
        principal = ctx.verifier.verify(token, app.clock())
    return Session(token, principal, csrf)


GatewayDep = Annotated[Gateway, Depends(gateway)]
SessionDep = Annotated[Session, Depends(session)]
ContextDep = Annotated[ServerContext, Depends(context)]
