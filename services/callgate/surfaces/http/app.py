"""The FastAPI application: routers, the error handlers, the guards, the console files.

``create_app`` builds it for a running server (``ServerContext``) or, with none, for the
OpenAPI document alone (``python -m callgate.surfaces.http.openapi``). ``asgi`` wraps it
in the security headers, outermost, so that even a ``500`` carries them.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from callgate.domain.codes import Rejection
from callgate.surfaces.http import errors
from callgate.surfaces.http.context import HttpOptions, ServerContext
from callgate.surfaces.http.guard import BodyLimit, RateLimit, SecurityHeaders
from callgate.surfaces.http.routers import (
    access_requests,
    audit,
    authzen,
    console,
    dev,
    health,
    invocations,
    oidc,
    pending,
    policy,
    proposals,
    session,
    slack,
    usage,
)
from callgate.surfaces.http.routers.console import STATIC
from callgate.surfaces.strict_body import StrictJsonBody

DESCRIPTION = """\
The HTTP API of callgate, a tool-call authorization gateway for AI agents.

Every `/v1` route but the development ones takes `Authorization: Bearer <session token>`
and answers for the bearer's tenant only. Errors are `{"error": {"code", "message"}}`
with a code of callgate's vocabulary; the status of each code is in the error table of
the HTTP API guide.
"""


def _version() -> str:
    try:
        return version("callgate")
    except PackageNotFoundError:
        return "0"


def create_app(
    ctx: ServerContext | None = None, *, dev_mode: bool = False, options: HttpOptions | None = None
) -> FastAPI:
    options = options or (ctx.options if ctx is not None else HttpOptions())
    api = FastAPI(
        title="callgate",
        version=_version(),
        description=DESCRIPTION,
        openapi_url="/v1/openapi.json",
        docs_url=None,  # Swagger UI and ReDoc load their assets from CDNs
        redoc_url=None,
    )
    api.state.context = ctx
    errors.install(api)
    for module in (
        proposals,
        invocations,
        pending,
        usage,
        audit,
        policy,
        session,
        oidc,
        slack,
        health,
        authzen,
        access_requests,
        console,
    ):
        api.include_router(module.router)
    if dev_mode:
        api.include_router(dev.router)
    api.mount("/console", StaticFiles(directory=STATIC), name="console")
    if options.cors_origins:
        api.add_middleware(
            CORSMiddleware,
            allow_origins=list(options.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key", "traceparent"],
            allow_credentials=False,
        )
    # Inside the body limit: the strict reader reads a body already bounded in size.
    api.add_middleware(StrictJsonBody, refuse=_refused_body, max_bytes=options.max_body_bytes)
    api.add_middleware(BodyLimit, max_bytes=options.max_body_bytes)
    api.add_middleware(RateLimit, rate_per_s=options.rate_per_s, burst=options.rate_burst)
    return api


def _refused_body(rejection: Rejection, body: bytes) -> ASGIApp:
    """``422 invalid_request`` naming what the strict reader refused (duplicate key, NaN,
    lone surrogate, number, depth); ``400`` on AuthZEN's routes, as that specification asks."""

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        status = errors.request_status(scope["path"], rejection.code)
        response = errors.error_response(rejection.code, rejection.message, status=status)
        await response(scope, receive, send)

    return answer


def asgi(ctx: ServerContext, *, dev_mode: bool = False) -> ASGIApp:
    return SecurityHeaders(create_app(ctx, dev_mode=dev_mode))
