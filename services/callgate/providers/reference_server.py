"""The reference implementation of the HTTP provider protocol (docs/provider-http.openapi.yaml).

A small system of record an adopter can read next to the OpenAPI document, and that the
tests start for real: ``python -m callgate.providers.reference_server --port 9000``.
It keeps resources (owner tenant and attributes) and applied effects in memory. Tools
are recognised by the last part of their name:

- ``*.read``: returns the resource; applies nothing;
- ``*.create``: creates a resource ``R-<hash of the token>`` owned by the caller's tenant;
- any other tool: merges ``args.fields`` (or the arguments) into the target's attributes.

What the protocol requires of any provider, and this one shows:

- ``execute`` is idempotent by ``Idempotency-Key``: a repeat returns the first result and
  applies nothing (callgate never repeats blindly, C12, but a provider must not trust that);
- ``lookup`` answers, for a key, whether its effect exists and with which result;
- ``dry_run`` and ``describe`` apply nothing.

``/_control/*`` (not part of the protocol) seeds resources, injects faults (answer only
after a delay, once the effect is applied: the "timeout after the effect" case) and
reports the effects and how many execute requests each key got.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import threading
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

PROTOCOL_VERSION = "1.0.0"
# The bearer scheme (stateless; one per module so that FastAPI resolves the annotation).
BEARER = HTTPBearer(
    auto_error=False,
    description="the provider's `credentials`, or the token its `upstream_token` obtained for"
    " the call (for the user by token exchange, or for callgate: ADR 0081)",
)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DryRunRequest(_Body):
    tool: str = Field(description="the catalog tool name, e.g. crm.update")
    target: str = Field(description="the resource the call acts on ('' when it creates one)")
    args: dict[str, Any] = Field(description="normalized arguments (validated by callgate)")
    tenant: str = Field(description="the session tenant the call acts for")


class DryRunResponse(_Body):
    snapshot: dict[str, Any] = Field(description="what execute would do; what a human confirms")


class ExecuteRequest(DryRunRequest):
    token: str = Field(description="callgate's idempotency token (also the Idempotency-Key)")
    invocation_id: str


class ExecuteResponse(_Body):
    result: dict[str, Any] = Field(description="the effect's result; the same on every repeat")


class LookupResponse(_Body):
    found: bool = Field(description="whether an effect with this token exists")
    result: dict[str, Any] | None = Field(description="its result when found")


class DescribeRequest(_Body):
    tool: str
    target: str


class DescribeResponse(_Body):
    found: bool = Field(description="whether the resource exists")
    tenant: str | None = Field(description="the owning tenant (null: nobody owns it)")
    attributes: dict[str, Any] = Field(
        default_factory=dict, description="plain JSON values the policy may use"
    )


class Resource(_Body):
    id: str
    tenant: str
    attributes: dict[str, Any] = Field(default_factory=dict)


class Faults(_Body):
    delay_after_apply_s: float = Field(default=0.0, ge=0.0)
    times: int = Field(default=0, ge=0, description="how many executes the delay hits")


class Store:
    """Resources, effects by token and execute counts (one lock; the handlers are short)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.resources: dict[str, Resource] = {}
        self.effects: dict[str, dict[str, Any]] = {}  # token -> effect record
        self.execute_requests: dict[str, int] = {}
        self.faults = Faults()

    def preview(self, req: DryRunRequest) -> dict[str, Any]:
        current = self.resources.get(req.target)
        kind = req.tool.rsplit(".", 1)[-1]
        changes = req.args.get("fields", req.args) if kind not in ("read", "create") else {}
        return {
            "tool": req.tool,
            "target": req.target,
            "action": kind,
            "current": current.attributes if current is not None else None,
            "changes": changes,
        }

    def apply(self, req: ExecuteRequest) -> dict[str, Any]:
        kind = req.tool.rsplit(".", 1)[-1]
        if kind == "read":
            current = self.resources.get(req.target)
            if current is None or current.tenant != req.tenant:
                raise HTTPException(404, f"no resource {req.target!r}")
            return {"id": current.id, **current.attributes}
        if kind == "create":
            new_id = "R-" + hashlib.sha256(req.token.encode()).hexdigest()[:12]
            attributes = {k: v for k, v in req.args.items() if isinstance(v, str | int | bool)}
            self.resources[new_id] = Resource(id=new_id, tenant=req.tenant, attributes=attributes)
            result: dict[str, Any] = {"id": new_id, "created": True, **attributes}
        else:
            current = self.resources.get(req.target)
            if current is None or current.tenant != req.tenant:
                raise HTTPException(404, f"no resource {req.target!r}")
            changes = req.args.get("fields", req.args)
            merged = {**current.attributes, **changes}
            self.resources[req.target] = current.model_copy(update={"attributes": merged})
            result = {"id": req.target, "updated": sorted(changes), **merged}
        self.effects[req.token] = {
            "token": req.token,
            "tool": req.tool,
            "target": req.target,
            "tenant": req.tenant,
            "invocation_id": req.invocation_id,
            "result": result,
        }
        return result


def create_app(store: Store | None = None, credential: str | None = None) -> FastAPI:
    """The protocol's routes over ``store``; with ``credential``, requests need
    ``Authorization: Bearer <credential>``."""
    db = store or Store()
    app = FastAPI(
        title="callgate HTTP provider protocol",
        version=PROTOCOL_VERSION,
        description=(
            "What a system must answer to be a callgate provider of kind `http` "
            "(profile `providers: {name: {kind: http, base_url: ...}}`). All bodies are "
            "JSON. Any non-2xx answer is a definite failure (nothing applied), except 504 "
            "on /execute, which means the outcome is unknown; callgate then reconciles "
            "with /lookup before any retry (C12)."
        ),
    )

    def authorized(
        given: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    ) -> None:
        if credential is not None and (given is None or given.credentials != credential):
            raise HTTPException(401, "missing or wrong bearer credential")

    guard = [Depends(authorized)]

    @app.post("/dry_run", dependencies=guard, summary="Preview an execution; apply nothing")
    def dry_run(req: DryRunRequest) -> DryRunResponse:
        with db.lock:
            return DryRunResponse(snapshot=db.preview(req))

    @app.post(
        "/execute",
        dependencies=guard,
        summary="Apply the effect once per Idempotency-Key",
        description="A repeat with the same key returns the first result, applying nothing.",
    )
    async def execute(
        req: ExecuteRequest, idempotency_key: Annotated[str, Header(alias="Idempotency-Key")]
    ) -> ExecuteResponse:
        if idempotency_key != req.token:
            raise HTTPException(400, "Idempotency-Key must equal the body's token")
        with db.lock:
            db.execute_requests[req.token] = db.execute_requests.get(req.token, 0) + 1
            known = db.effects.get(req.token)
            result = known["result"] if known is not None else db.apply(req)
            delay = 0.0
            if known is None and db.faults.times > 0:
                db.faults = db.faults.model_copy(update={"times": db.faults.times - 1})
                delay = db.faults.delay_after_apply_s
        if delay:
            await asyncio.sleep(delay)  # the effect exists; the caller times out first
        return ExecuteResponse(result=result)

    @app.get("/lookup/{token}", dependencies=guard, summary="Did an effect with this token happen?")
    def lookup(token: str) -> LookupResponse:
        with db.lock:
            effect = db.effects.get(token)
        return LookupResponse(found=effect is not None, result=effect and effect["result"])

    @app.post("/describe", dependencies=guard, summary="Owner and attributes of a resource")
    def describe(req: DescribeRequest) -> DescribeResponse:
        with db.lock:
            resource = db.resources.get(req.target)
        if resource is None:
            return DescribeResponse(found=False, tenant=None)
        return DescribeResponse(found=True, tenant=resource.tenant, attributes=resource.attributes)

    # -- not part of the protocol: test and demo controls ---------------------------------

    @app.get("/_control/health", include_in_schema=False)
    def health() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/_control/resources", include_in_schema=False)
    def seed(resource: Resource) -> Resource:
        with db.lock:
            db.resources[resource.id] = resource
        return resource

    @app.post("/_control/faults", include_in_schema=False)
    def faults(plan: Faults) -> Faults:
        with db.lock:
            db.faults = plan
        return plan

    @app.get("/_control/effects", include_in_schema=False)
    def effects() -> dict[str, Any]:
        with db.lock:
            return {
                "effects": list(db.effects.values()),
                "execute_requests": dict(db.execute_requests),
            }

    return app


def openapi_document() -> str:
    """The protocol as OpenAPI YAML (``docs/provider-http.openapi.yaml`` is this, checked in)."""
    import yaml

    return yaml.safe_dump(create_app().openapi(), sort_keys=False, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description="The reference HTTP provider (in memory).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--credential-env", help="require this variable's value as a bearer credential"
    )
    parser.add_argument("--openapi", action="store_true", help="print the protocol; exit")
    ns = parser.parse_args(argv)
    if ns.openapi:
        print(openapi_document(), end="")
        return 0
    credential = os.environ.get(ns.credential_env, "") if ns.credential_env else None
    if ns.credential_env and not credential:
        parser.error(f"{ns.credential_env} is not set")
    uvicorn.run(create_app(credential=credential), host=ns.host, port=ns.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
