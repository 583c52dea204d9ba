"""Dependencies: the gateway of the running server and the bearer's verified session.

The session is verified once per request here, with the same verifier the decider uses
(C6); a route receives the ``Session`` and scopes every read to its tenant. Tokens are
read from the ``Authorization`` header only: no cookie, no query parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from callgate.domain.codes import Code, Rejection
from callgate.domain.principal import Principal
from callgate.surfaces.gateway import Gateway
from callgate.surfaces.http.context import ServerContext

bearer = HTTPBearer(auto_error=False, description="A callgate session token")


@dataclass(frozen=True, slots=True)
class Session:
    token: str
    principal: Principal

    @property
    def tenant(self) -> str:
        return self.principal.tenant


def context(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.context
    return ctx


def gateway(ctx: Annotated[ServerContext, Depends(context)]) -> Gateway:
    return ctx.gateway


def session(
    ctx: Annotated[ServerContext, Depends(context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Session:
    """The verified bearer, or ``401 unauthenticated``."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise Rejection(Code.UNAUTHENTICATED, "send Authorization: Bearer <session token>")
    app = ctx.gateway.app
    with ctx.lock:  # the verifier's cache is not thread-safe; routes run in threads
        principal = ctx.verifier.verify(credentials.credentials, app.clock())
    return Session(credentials.credentials, principal)


GatewayDep = Annotated[Gateway, Depends(gateway)]
SessionDep = Annotated[Session, Depends(session)]
ContextDep = Annotated[ServerContext, Depends(context)]
