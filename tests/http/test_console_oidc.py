"""Sign-in with the identity provider, in Chromium, against a real OpenID Connect provider.

``oidc-provider`` (npm, run by Node.js, tests/oidc) listens on loopback with its own
login and consent pages; ``callgate serve --http`` runs in production mode (no
development issuer) trusting it through ``[[sessions.issuers]]`` (discovery, its JWKS)
and, for the agents' tokens, a platform issuer of key files. The approver signs in by
the authorization code flow with PKCE, approves in the console, reloads, signs out; a
cookie-signed request without its CSRF token is refused and does nothing.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from tools.ports import free_port

from callgate.adapters.keyfiles import generate_key_pair
from tests.http.approval_flow import effects_of, refund_waited_on_runs_once_approved
from tests.http_support import CHROMIUM, HOSTILE_JSON, REFUND_BIG, HttpServe
from tests.idp import IdentityProvider
from tests.oidc_support import OpenIdProvider, missing

pytestmark = pytest.mark.browser

WHY = missing() or (None if CHROMIUM.exists() else f"{CHROMIUM} is absent")
if WHY:
    print(WHY, file=sys.stderr)
    pytest.skip(WHY, allow_module_level=True)

from playwright.sync_api import Browser, Page, expect  # noqa: E402

from tests.http.test_console_browser import (  # noqa: E402
    item,
    new_page,
    no_page_errors,
)

ACCOUNTS = {
    "fran": {"tenant": "acme", "roles": ["finance-approver"]},
    "alice": {"tenant": "acme", "roles": ["support"]},
    "nobody": {},  # the provider knows them, but their ID token carries no tenant or roles
}


class HasServe(Protocol):
    """A deployment with ``callgate serve --http`` (this module's, or another's)."""

    @property
    def serve(self) -> HttpServe: ...


class Deployment:
    """The provider and ``callgate serve --http`` trusting it; ``env`` and ``state_dir``
    put the server on a Kafka deployment."""

    def __init__(
        self,
        root: Path,
        env: dict[str, str] | None = None,
        state_dir: Path | None = None,
        *,
        ttl_s: int = 3600,
        skew_s: int = 5,
    ) -> None:
        port = free_port()
        self.redirect_uri = f"http://127.0.0.1:{port}/v1/oidc/callback"
        self.idp = OpenIdProvider(root / "idp.log", self.redirect_uri, ACCOUNTS, ttl_s)
        self.platform = IdentityProvider(root / "platform")
        generate_key_pair(self.platform.keys, "session", "EdDSA", "platform-1")
        config = root / "callgate.toml"
        config.write_text(
            # Two issuers: each is bound to the tenants it may assert (ADR 0078).
            self.idp.issuer_config(self.redirect_uri, extra='tenants = ["acme"]\n')
            + "\n[[sessions.issuers]]\n"
            f'issuer = "{self.platform.issuer}"\n'
            f'jwks_file = "{self.platform.jwks}"\n'
            'tenants = ["acme"]\n'
        )
        try:
            self.serve = HttpServe(
                state_dir or root / "state",
                root / "serve.log",
                env={**(env or {}), "CALLGATE_CONFIG": str(config)},
                port=port,
            )
            self.serve.wait_ready(timeout_s=120)
        except BaseException:
            self.idp.stop()
            raise

    def agent(self, user: str = "alice") -> str:
        return self.platform.token("platform-1", user, "acme", "support")

    def stop(self) -> None:
        try:
            assert self.serve.stop() == 0, self.serve.log.read_text()
            assert "Traceback" not in self.serve.log.read_text(), self.serve.log.read_text()
        finally:
            self.idp.stop()


@pytest.fixture(scope="module")
def oidc_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    d = Deployment(tmp_path_factory.mktemp("oidc"))
    try:
        yield d
    finally:
        d.stop()


def propose_refund(d: Deployment, order: str) -> str:
    with d.serve.client(d.agent()) as c:
        answer = c.post(
            "/v1/proposals",
            json={"tool": "refunds.issue", "args": {**REFUND_BIG, "order_id": order}},
            headers={"Idempotency-Key": f"{order}-{uuid.uuid4().hex[:6]}"},
        ).json()
    assert answer["outcome"] == "approval_required", answer
    invocation: str = answer["invocation_id"]
    return invocation


def approval_state(d: Deployment, invocation: str) -> Any:
    with d.serve.client(d.agent()) as c:
        return c.get(f"/v1/invocations/{invocation}").json()["approval"]


def through_the_provider(page: Page, d: HasServe, login: str, provider: str = "Test IdP") -> None:
    """Sign in through the provider named ``provider`` on the console's sign-in link."""
    page.goto(d.serve.url + "/")
    expect(page.locator("#token-form")).to_be_hidden()  # production: no pasted tokens
    expect(page.locator("#dev-form")).to_be_hidden()
    page.get_by_role("link", name=f"Sign in with {provider}").click()
    # oidc-provider's own login and consent pages.
    page.locator('input[name="login"]').fill(login)
    page.locator('input[name="password"]').fill("any")
    page.locator('button[type="submit"]').click()
    page.locator('button[type="submit"]').click()  # consent: openid, callgate


def sign_in_with_provider(page: Page, d: Deployment, login: str) -> None:
    through_the_provider(page, d, login)
    expect(page.locator("#who-text")).to_contain_text(f"{login} @ acme")
    expect(page.locator("#live")).to_have_text("live")


def test_approver_signs_in_with_the_provider_approves_reloads_and_signs_out(
    oidc_deployment: Deployment, browser: Browser
) -> None:
    d = oidc_deployment
    invocation = propose_refund(d, "ORD-501")
    page = new_page(browser)
    sign_in_with_provider(page, d, "fran")
    assert page.url == d.serve.url + "/"  # back on the console, no code or state in the URL

    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["__Host-callgate-session"]
    assert session["httpOnly"] and session["secure"] and session["sameSite"] == "Strict"
    csrf = cookies["__Host-callgate-csrf"]
    assert csrf["httpOnly"] and csrf["secure"] and csrf["sameSite"] == "Strict"
    assert "__Host-callgate-sign-in" not in cookies  # the sign-in's secrets are gone
    # Expiry follows the provider's token: the cookie ends when the ID token does.
    me = page.evaluate("fetch('/v1/session').then(r => r.json())")
    assert me["user"] == "fran" and me["roles"] == ["finance-approver"]
    assert abs(session["expires"] - me["expires_at"] / 1000) <= 2
    assert 3000 < me["expires_at"] / 1000 - time.time() <= 3600

    item(page, invocation).click()
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#detail-result")).to_contain_text("Approved.")
    approval = approval_state(d, invocation)
    assert approval["state"] == "granted" and approval["approver"] == "fran", approval

    # A reload keeps the session (the cookie); sign-out ends it on the server.
    page.reload()
    expect(page.locator("#who-text")).to_contain_text("fran @ acme")
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("link", name="Sign in with Test IdP")).to_be_visible()
    names = {c["name"] for c in page.context.cookies()}
    assert "__Host-callgate-session" not in names and "__Host-callgate-csrf" not in names
    page.reload()
    expect(page.get_by_role("link", name="Sign in with Test IdP")).to_be_visible()
    no_page_errors(page)
    page.close()


def test_a_refund_the_agent_waits_on_is_approved_in_the_console_and_runs_once(
    oidc_deployment: Deployment, browser: Browser
) -> None:
    """Issue 27: the agent's ``callgate propose --wait`` (the installed command, its own
    process) waits; fran signs in through the provider, opens the link callgate hands out
    and approves; the refund runs without resubmission, the agent prints ``executed``;
    one effect, ``audit verify`` true, replay equal."""
    d = oidc_deployment
    page = new_page(browser)
    sign_in_with_provider(page, d, "fran")

    def approve_in_the_console(invocation: str) -> None:
        page.goto(f"{d.serve.url}/#invocation={invocation}")
        expect(page.locator("#live-state")).to_contain_text("Pending approval")
        page.get_by_role("button", name="Approve", exact=True).click()
        expect(page.locator("#detail-result")).to_contain_text("Approved.")

    inv = refund_waited_on_runs_once_approved(d.serve, d.agent(), d.agent(), approve_in_the_console)
    expect(page.locator("#live-state")).to_contain_text("Executed")
    approval = approval_state(d, inv)
    assert approval["state"] == "granted" and approval["approver"] == "fran", approval
    no_page_errors(page)
    page.close()


def test_a_cookie_request_without_its_csrf_token_is_refused_and_does_nothing(
    oidc_deployment: Deployment, browser: Browser
) -> None:
    d = oidc_deployment
    invocation = propose_refund(d, "ORD-502")
    page = new_page(browser)
    sign_in_with_provider(page, d, "fran")
    url = f"/v1/invocations/{invocation}/approve"
    for headers in ({}, {"X-CSRF-Token": "not-the-token"}):
        answer = page.evaluate(
            """([url, headers]) => fetch(url, {method: "POST", headers, credentials: "same-origin"})
                 .then(async r => ({status: r.status, body: await r.json()}))""",
            [url, headers],
        )
        assert answer["status"] == 403, answer
        assert answer["body"]["error"]["code"] == "csrf_failed", answer
    assert approval_state(d, invocation)["state"] == "pending"  # nothing was approved
    assert effects_of(d.serve, invocation) == []  # nothing executed
    page.close()


def test_an_id_token_without_tenant_and_roles_signs_nobody_in(
    oidc_deployment: Deployment, browser: Browser
) -> None:
    page = new_page(browser)
    through_the_provider(page, oidc_deployment, "nobody")
    expect(page.locator("#alert")).to_contain_text("Sign-in failed")
    assert page.url == oidc_deployment.serve.url + "/"  # the error parameter is gone from the URL
    expect(page.locator("#workspace")).to_be_hidden()
    names = {c["name"] for c in page.context.cookies()}
    assert "__Host-callgate-session" not in names
    log = oidc_deployment.serve.log.read_text()
    assert "missing claims: tenant, roles" in log, log
    page.close()


def test_a_callback_not_started_by_this_browser_signs_nobody_in(
    oidc_deployment: Deployment,
) -> None:
    d = oidc_deployment
    with httpx.Client(base_url=d.serve.url) as c:
        r = c.get("/v1/oidc/callback", params={"code": "stolen", "state": "guessed"})
        assert r.status_code == 303
        assert r.headers["location"] == "/?sign_in_error=unauthenticated"
        assert "set-cookie" not in r.headers or "callgate-session" not in r.headers["set-cookie"]
        providers = c.get("/v1/oidc/providers").json()
        assert providers == [
            {"name": "Test IdP", "issuer": d.idp.issuer, "sign_in_url": "/v1/oidc/sign-in/0"}
        ]
        begin = c.get("/v1/oidc/sign-in/0")
        assert begin.status_code == 303
        location = begin.headers["location"]
        assert location.startswith(d.idp.issuer + "/auth?")
        assert "code_challenge_method=S256" in location and "nonce=" in location
        # The development routes do not exist outside development mode.
        assert c.get("/v1/dev/users").status_code == 404


def test_the_session_ends_when_the_providers_token_expires(
    browser: Browser, tmp_path: Path
) -> None:
    d = Deployment(tmp_path, ttl_s=8, skew_s=0)
    try:
        page = new_page(browser)
        sign_in_with_provider(page, d, "fran")
        me = page.evaluate("fetch('/v1/session').then(r => r.json())")
        assert me["expires_at"] / 1000 - time.time() <= 8
        expect(page.locator("#alert")).to_contain_text("Your session has expired", timeout=20_000)
        expect(page.get_by_role("link", name="Sign in with Test IdP")).to_be_visible()
        status = page.evaluate("fetch('/v1/pending').then(r => r.status)")
        assert status == 401
        no_page_errors(page)
        page.close()
    finally:
        d.stop()


SIGN_IN_ENDPOINTS = (
    "/v1/session/sign-out",
    "/v1/session",
    "/v1/oidc/providers",
    "/v1/oidc/sign-in/0",
    "/v1/oidc/callback",
)


def test_hostile_bodies_to_the_sign_in_endpoints_are_refused_and_change_nothing(
    oidc_deployment: Deployment, browser: Browser
) -> None:
    """Each hostile class of body, sent with a signed-in session's cookies and its CSRF
    token, is refused with its code before any route runs: no cookie is set or cleared,
    the session still holds; the same sign-out with a plain body then does sign out."""
    d = oidc_deployment
    page = new_page(browser)
    sign_in_with_provider(page, d, "fran")
    jar = {c["name"]: c["value"] for c in page.context.cookies()}
    csrf = jar["__Host-callgate-csrf"]
    cookie = "; ".join(f"{n}={jar[n]}" for n in ("__Host-callgate-session", "__Host-callgate-csrf"))
    headers = {"Cookie": cookie, "X-CSRF-Token": csrf, "Content-Type": "application/json"}
    with httpx.Client(base_url=d.serve.url, headers=headers, timeout=30) as c:
        for path in SIGN_IN_ENDPOINTS:
            for what, (body, status, code) in HOSTILE_JSON.items():
                r = c.post(path, content=body)
                assert r.status_code == status, (path, what, r.text)
                assert r.json()["error"]["code"] == code, (path, what, r.text)
                assert "set-cookie" not in r.headers, (path, what, r.headers)
        assert c.get("/v1/session").json()["user"] == "fran"  # still signed in
        signed_out = c.post("/v1/session/sign-out", content=b"{}")
        assert signed_out.status_code == 204 and "set-cookie" in signed_out.headers
    assert "Traceback" not in d.serve.log.read_text()
    page.close()


def test_a_hostile_callback_query_signs_nobody_in(oidc_deployment: Deployment) -> None:
    """The provider's redirect back, read strictly: an oversized query, a parameter given
    twice, a percent-escape that is not UTF-8 each end the sign-in with
    ``sign_in_error=unauthenticated`` and no session, even with this browser's own sign-in
    cookie and state; a sign-in path that is no provider's number is a coded 4xx."""
    d = oidc_deployment
    with httpx.Client(base_url=d.serve.url, timeout=30) as c:
        begin = c.get("/v1/oidc/sign-in/0")
        assert begin.status_code == 303
        tx = begin.headers["set-cookie"].split(";")[0]
        state = parse_qs(urlsplit(begin.headers["location"]).query)["state"][0]
        queries = {
            "oversized": f"state={state}&code={'c' * 9000}",
            "state twice": f"state={state}&state={state}&code=abc",
            "code twice": f"state={state}&code=abc&code=def",
            "not UTF-8": f"state={state}&code=%FF%FE",
            "too many fields": f"state={state}&code=abc&" + "&".join(f"f{i}=1" for i in range(20)),
        }
        for what, query in queries.items():
            r = c.get(f"/v1/oidc/callback?{query}", headers={"Cookie": tx})
            assert r.status_code == 303, (what, r.text)
            assert r.headers["location"] == "/?sign_in_error=unauthenticated", what
            assert "callgate-session" not in r.headers.get("set-cookie", ""), what
        for index in ("NaN", "Infinity", "1e400", "9" * 400, "-1", "%F0%9F", "0x0"):
            r = c.get(f"/v1/oidc/sign-in/{index}")
            assert r.status_code in (404, 422), (index, r.text)
            assert r.json()["error"]["code"] in ("not_found", "invalid_request"), index
            assert "set-cookie" not in r.headers, index
    log = d.serve.log.read_text()
    for says in ("over 8192 bytes", "the field 'state' repeats", "the field 'code' repeats",
                 "not readable: 'utf-8' codec", "not readable: Max number of fields"):  # fmt: skip
        assert says in log, says
    assert "Traceback" not in log
