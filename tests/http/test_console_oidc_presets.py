"""The console's sign-in with ID tokens shaped as Entra ID and Okta issue them, accepted
through the presets (ADR 0078), in Chromium against two real OpenID Connect providers.

Two ``oidc-provider`` instances (npm, tests/oidc) sign in the approvers: one issues
Entra-shaped claims (``tid``, ``oid``, app ``roles``, ``ver`` 2.0) and is trusted with
``preset = "entra"`` bound to its directory; the other Okta-shaped ones (``groups``, a
``sub`` that is Okta's user id) with ``preset = "okta"`` for tenant acme. The agents'
tokens come from a platform issuer of key files. ``callgate serve --http`` runs in
production mode; its profile gives the Entra directory its own orders. For each provider:
the approver signs in, the session names the mapped user, tenant and roles, the approver
approves a refund of their tenant in the console, the refund runs, and its audit record
names the mapped approver.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from tools.ports import free_port

from callgate.adapters.keyfiles import generate_key_pair
from tests.e2e.helpers import DEFAULT_PROFILE
from tests.http_support import CHROMIUM, REFUND_BIG, HttpServe, wait_until
from tests.idp import IdentityProvider
from tests.oidc_support import OpenIdProvider, missing
from tests.provider_shapes import ENTRA_TID, audit_records

pytestmark = pytest.mark.browser

WHY = missing() or (None if CHROMIUM.exists() else f"{CHROMIUM} is absent")
if WHY:
    print(WHY, file=sys.stderr)
    pytest.skip(WHY, allow_module_level=True)

from playwright.sync_api import Browser, expect  # noqa: E402

from tests.http.test_console_browser import item, new_page, no_page_errors  # noqa: E402
from tests.http.test_console_oidc import through_the_provider  # noqa: E402


@dataclass(frozen=True)
class SignInShape:
    """One provider's ID tokens: its button, scope and claims, an approver's account, and
    what callgate makes of them."""

    name: str  # the sign-in button's
    table: str  # ``[[sessions.issuers]]`` keys beyond the sign-in ones
    claims: dict[str, list[str]]  # scope -> the claims it puts in the ID token
    login: str
    account: dict[str, Any]
    user: str
    tenant: str
    order: str  # the prefix of the tenant's orders


ENTRA = SignInShape(
    "Entra ID",
    f'preset = "entra"\ntenants = ["{ENTRA_TID}"]\nroles = ["finance-approver"]\n'
    '[sessions.issuers.role_map]\n"Refunds.Approve" = "finance-approver"\n',
    {"callgate": ["tid", "oid", "roles", "ver", "name", "preferred_username"]},
    "pairwise-sub-of-fran",  # Entra's sub differs per application: the user is oid
    {
        "ver": "2.0",
        "tid": ENTRA_TID,
        "oid": "7a1f0c2e-0000-4000-8000-00000000f4a2",
        "roles": ["Refunds.Approve", "Directory.Reader"],
        "name": "Fran Fischer",
        "preferred_username": "fran@contoso.example",
    },
    "7a1f0c2e-0000-4000-8000-00000000f4a2",
    ENTRA_TID,
    "EORD",
)
OKTA = SignInShape(
    "Okta",
    'preset = "okta"\ntenant = "acme"\n'
    '[sessions.issuers.role_map]\n"callgate-finance" = "finance-approver"\n',
    {"groups": ["groups", "ver", "name", "preferred_username"]},
    "00u2fran0vZVGYvTN5d7",  # an Okta ID token's sub is the user's id
    {
        "ver": 1,
        "groups": ["Everyone", "callgate-finance"],
        "name": "Fran Fischer",
        "preferred_username": "fran@acme.example",
    },
    "00u2fran0vZVGYvTN5d7",
    "acme",
    "ORD",
)
SHAPES = (ENTRA, OKTA)


def profile_with_entra_orders(directory: Path) -> Path:
    """The default profile, with the Entra directory owning the orders ``EORD-*``."""
    directory.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(DEFAULT_PROFILE.read_text())
    shutil.copy(DEFAULT_PROFILE.parent / doc["policy_file"], directory / doc["policy_file"])
    doc["resources"][ENTRA_TID] = ["EORD-*"]
    path = directory / "profile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class Deployment:
    """The two providers, the platform issuer and ``callgate serve --http``."""

    def __init__(self, root: Path) -> None:
        port = free_port()
        self.redirect_uri = f"http://127.0.0.1:{port}/v1/oidc/callback"
        self.idps: dict[str, OpenIdProvider] = {}
        try:
            for i, shape in enumerate(SHAPES):
                self.idps[shape.name] = OpenIdProvider(
                    root / f"idp-{i}.log",
                    self.redirect_uri,
                    {shape.login: shape.account},
                    claims=shape.claims,
                    kid=f"idp-{i}-rs256",
                )
            self.platform = IdentityProvider(root / "platform")
            generate_key_pair(self.platform.keys, "session", "EdDSA", "platform-1")
            config = root / "callgate.toml"
            config.write_text(
                "".join(
                    self.idps[s.name].issuer_config(
                        self.redirect_uri, ("openid", *s.claims), extra=s.table, name=s.name
                    )
                    for s in SHAPES
                )
                + "[[sessions.issuers]]\n"
                f'issuer = "{self.platform.issuer}"\n'
                f'jwks_file = "{self.platform.jwks}"\n'
                f'tenants = ["acme", "{ENTRA_TID}"]\n'
            )
            self.serve = HttpServe(
                root / "state",
                root / "serve.log",
                profile=profile_with_entra_orders(root / "profile"),
                env={"CALLGATE_CONFIG": str(config)},
                port=port,
            )
            self.serve.wait_ready(timeout_s=120)
        except BaseException:
            self.stop_providers()
            raise

    def agent(self, tenant: str) -> str:
        return self.platform.token("platform-1", "alice", tenant, "support")

    def stop_providers(self) -> None:
        for idp in self.idps.values():
            idp.stop()

    def stop(self) -> None:
        try:
            assert self.serve.stop() == 0, self.serve.log.read_text()
            assert "Traceback" not in self.serve.log.read_text(), self.serve.log.read_text()
        finally:
            self.stop_providers()


@pytest.fixture(scope="module")
def oidc_presets_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    d = Deployment(tmp_path_factory.mktemp("oidc-presets"))
    try:
        yield d
    finally:
        d.stop()


@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_an_approver_signs_in_with_a_providers_id_token_and_approves(
    oidc_presets_deployment: Deployment, browser: Browser, shape: SignInShape
) -> None:
    d = oidc_presets_deployment
    agent = d.agent(shape.tenant)
    refund = {**REFUND_BIG, "order_id": f"{shape.order}-{uuid.uuid4().hex[:6]}"}
    with d.serve.client(agent) as c:
        proposed = c.post("/v1/proposals", json={"tool": "refunds.issue", "args": refund}).json()
    assert proposed["outcome"] == "approval_required", proposed
    invocation = proposed["invocation_id"]

    page = new_page(browser)
    through_the_provider(page, d, shape.login, shape.name)
    expect(page.locator("#who-text")).to_contain_text(f"{shape.user} @ {shape.tenant}")
    me = page.evaluate("fetch('/v1/session').then(r => r.json())")
    assert (me["user"], me["tenant"], me["roles"]) == (
        shape.user,
        shape.tenant,
        ["finance-approver"],
    ), me
    item(page, invocation).click()
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#detail-result")).to_contain_text("Approved.")
    no_page_errors(page)
    page.close()

    def executed() -> bool:
        with d.serve.client(agent) as c:
            return bool(c.get(f"/v1/invocations/{invocation}").json()["outcome"] == "executed")

    wait_until(executed, 60, "the approved refund to run")
    wait_until(lambda: bool(audit_records(d.serve.state_dir, invocation)), 30, "its audit")
    record = audit_records(d.serve.state_dir, invocation)[-1]
    assert record["approval_request"]["state"] == "granted", record
    assert record["approval_request"]["approver"] == shape.user, record
    assert record["authorized_by"]["principal"]["tenant"] == shape.tenant, record
