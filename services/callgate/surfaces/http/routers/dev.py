"""``/v1/dev``: sign in as a sample user; mounted only in development mode (``--dev``).

Without development mode these routes do not exist (404) and are absent from the
OpenAPI document. The tokens come from the development issuer, as
``callgate session issue`` does.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from callgate.domain.codes import Code
from callgate.surfaces.http.deps import ContextDep
from callgate.surfaces.http.errors import ApiError

router = APIRouter(prefix="/v1/dev", tags=["development"])

# Sample users of the default profile: callers, approvers, and one of another tenant.
DEV_USERS: tuple[dict[str, Any], ...] = (
    {"user": "alice", "tenant": "acme", "roles": ["support"]},
    {"user": "fran", "tenant": "acme", "roles": ["finance-approver"]},
    {"user": "sue", "tenant": "acme", "roles": ["support", "finance-approver"]},
    {"user": "rory", "tenant": "acme", "roles": ["release"]},
    {"user": "rel", "tenant": "acme", "roles": ["release-manager"]},
    {"user": "adam", "tenant": "acme", "roles": ["admin", "admin-approver"]},
    {"user": "gina", "tenant": "globex", "roles": ["support", "finance-approver"]},
)
DEV_TTL_S = 8 * 3600


class DevUser(BaseModel):
    user: str
    tenant: str
    roles: list[str]


class DevSignIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, max_length=100)


class DevToken(BaseModel):
    token: str


@router.get("/users", operation_id="devUsers", response_model=list[DevUser])
def dev_users() -> Any:
    return list(DEV_USERS)


@router.post("/sessions", operation_id="devSignIn", response_model=DevToken)
def dev_sign_in(body: DevSignIn, ctx: ContextDep) -> Any:
    found = next((u for u in DEV_USERS if u["user"] == body.user), None)
    if found is None:
        raise ApiError(Code.NOT_FOUND, f"no sample user {body.user!r}")
    app = ctx.gateway.app
    token = app.session_issuer.issue(
        found["user"], found["tenant"], found["roles"], app.clock(), ttl_seconds=DEV_TTL_S
    )
    return {"token": token}
