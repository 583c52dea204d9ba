"""``/v1/oidc``: the console signs approvers in with an OpenID Connect provider (ADR 0031).

Authorization code flow with PKCE, through the provider adapter
(``callgate.adapters.oidc``): ``sign-in/{n}`` redirects the browser to provider ``n``
with a fresh ``state``, ``nonce`` and PKCE challenge, kept in a short-lived HttpOnly
cookie; ``callback`` redeems the code for the ID token, which the same session verifier
as any bearer token checks (C6: issuer, audience, signature, time, ``sub``/``tenant``/
``roles``), then the nonce. The console's session is then that ID token in an HttpOnly,
Secure, SameSite=Strict cookie that expires with it, and a CSRF cookie whose value every
state-changing request repeats in ``X-CSRF-Token`` (``deps.check_csrf``).
"""

from __future__ import annotations

import hmac
import logging
import secrets
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Path, Request
from fastapi.responses import RedirectResponse, Response

from callgate.domain.codes import Code, Rejection
from callgate.surfaces.http.context import ServerContext, SignIn
from callgate.surfaces.http.deps import CSRF_COOKIE, SESSION_COOKIE, ContextDep
from callgate.surfaces.http.errors import ApiError
from callgate.surfaces.http.models import SignInProvider, errors
from callgate.surfaces.strict_body import read_form

log = logging.getLogger("callgate.http")
router = APIRouter(prefix="/v1/oidc", tags=["sign-in"])

TRANSACTION_COOKIE = "__Host-callgate-sign-in"
TRANSACTION_TTL_S = 600
# A provider's redirect carries a few short parameters (code, state, iss, session_state,
# error...): anything much larger or longer is not one.
CALLBACK_MAX_QUERY_BYTES = 8 * 1024
CALLBACK_MAX_FIELDS = 16


@router.get(
    "/providers",
    operation_id="signInProviders",
    summary="The identity providers the console signs in with (none: paste a token)",
    response_model=list[SignInProvider],
    responses=errors(429, 500),
)
def providers(ctx: ContextDep) -> Any:
    return [
        {"name": p.name, "issuer": p.issuer, "sign_in_url": f"/v1/oidc/sign-in/{p.index}"}
        for p in ctx.sign_in
    ]


def _provider(ctx: ServerContext, index: int) -> SignIn:
    found = next((p for p in ctx.sign_in if p.index == index), None)
    if found is None:
        raise ApiError(Code.NOT_FOUND, f"no sign-in provider {index}")
    return found


@router.get(
    "/sign-in/{index}",
    operation_id="signIn",
    status_code=303,
    response_class=Response,
    responses=errors(404, 422, 429, 500),
)
def sign_in(index: Annotated[int, Path(ge=0, le=1000)], ctx: ContextDep) -> Response:
    """Redirect to the provider's authorization endpoint (a browser navigation)."""
    url, tx = _provider(ctx, index).begin()
    response = RedirectResponse(url, status_code=303)
    # Lax, not Strict: the provider's redirect back is a cross-site top-level navigation,
    # which must carry this cookie; it holds no session, only this sign-in's secrets.
    response.set_cookie(
        TRANSACTION_COOKIE,
        tx.encode(),
        max_age=TRANSACTION_TTL_S,
        path="/",
        secure=True,
        httponly=True,
        samesite="lax",
    )
    return response


def _callback_params(query: bytes) -> dict[str, str]:
    """The callback's query, read strictly (``read_form``): a parameter given twice, bytes
    that are not percent-encoded UTF-8, or an oversized query refuse the sign-in
    (``SignInError``) instead of being read leniently."""
    from callgate.adapters.oidc import SignInError

    if len(query) > CALLBACK_MAX_QUERY_BYTES:
        raise SignInError(f"the callback's query is over {CALLBACK_MAX_QUERY_BYTES} bytes")
    try:
        return read_form(query, CALLBACK_MAX_FIELDS, encoding="ascii")
    except ValueError as exc:
        raise SignInError(f"the callback's query is not readable: {exc}") from None


def _back(error: Code | None = None) -> RedirectResponse:
    where = "/" if error is None else "/?" + urlencode({"sign_in_error": error.value})
    response = RedirectResponse(where, status_code=303)
    response.delete_cookie(TRANSACTION_COOKIE, path="/", secure=True, httponly=True)
    return response


@router.get(
    "/callback",
    operation_id="signInCallback",
    status_code=303,
    response_class=Response,
    responses=errors(429, 500),
)
def callback(request: Request, ctx: ContextDep) -> Response:
    """Finish the sign-in: the session and CSRF cookies, then back to the console."""
    from callgate.adapters.oidc import SignInError, Transaction

    tx = Transaction.decode(request.cookies.get(TRANSACTION_COOKIE))
    if tx is None:
        log.warning("sign-in callback without this browser's sign-in cookie")
        return _back(Code.UNAUTHENTICATED)
    try:
        params = _callback_params(request.scope.get("query_string", b""))
        provider = _provider(ctx, tx.provider)
        id_token = provider.finish(tx, params)
        now = ctx.gateway.app.clock()
        with ctx.lock:
            principal, claims = ctx.verifier.verify_with_claims(id_token, now)
        nonce = claims.get("nonce")
        if claims.get("iss") != provider.issuer:
            raise SignInError("the ID token comes from another issuer")
        if not isinstance(nonce, str) or not hmac.compare_digest(nonce.encode(), tx.nonce.encode()):
            raise SignInError("the ID token's nonce is not this sign-in's")
    except (SignInError, ApiError, Rejection) as exc:
        log.warning("sign-in refused: %s", exc)
        return _back(Code.UNAUTHENTICATED)
    response = _back()
    max_age = max(0, (principal.expires_at - now) // 1000)
    for name, value in ((SESSION_COOKIE, id_token), (CSRF_COOKIE, secrets.token_urlsafe(32))):
        response.set_cookie(
            name, value, max_age=max_age, path="/", secure=True, httponly=True, samesite="strict"
        )
    return response
