"""``/v1/session``: who the caller is (the console shows it after sign-in), and the
console's sign-out."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from callgate.surfaces.http.deps import CSRF_COOKIE, SESSION_COOKIE, SessionDep, check_csrf
from callgate.surfaces.http.models import COMMON, SessionInfo, errors

router = APIRouter(prefix="/v1/session", tags=["session"])


@router.get(
    "",
    operation_id="getSession",
    summary="The verified session of the bearer",
    response_model=SessionInfo,
    responses=errors(*COMMON),
)
def get_session(sess: SessionDep) -> Any:
    p = sess.principal
    return {
        "user": p.user,
        "tenant": p.tenant,
        "roles": list(p.roles),
        "expires_at": p.expires_at,
        "csrf_token": sess.csrf_token,
    }


@router.post(
    "/sign-out",
    operation_id="signOut",
    summary="End the console's cookie session (its CSRF token is required)",
    status_code=204,
    response_class=Response,
    responses=errors(403, 413, 429, 500),
)
def sign_out(request: Request) -> Response:
    """Clears the session and CSRF cookies. An expired session can sign out too, so only
    the CSRF token is checked."""
    check_csrf(request)
    response = Response(status_code=204)
    for name in (SESSION_COOKIE, CSRF_COOKIE):
        response.delete_cookie(name, path="/", secure=True, httponly=True, samesite="strict")
    return response
