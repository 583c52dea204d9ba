"""The approval console in a real browser: Debian's Chromium, headless, driven by Playwright.

The server is ``callgate serve --http`` in development mode (sample users) with
``deploys.trigger`` approvals that expire after a few seconds. The agent's side of each
story goes through the HTTP API with httpx, the approver's through the console. Skipped,
with the reason printed, only where ``/usr/bin/chromium`` is absent (no browser is ever
downloaded). ``CALLGATE_SCREENSHOT_DIR=docs`` (``make screenshots``) also writes the
screenshots of the guide there.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.http_support import REFUND_BIG, HttpServe, short_ttl_profile

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEPLOY = {"service": "search", "version": "7.0.0", "environment": "production"}
TTL_S = 8

if not CHROMIUM.exists():
    REASON = f"browser tests skipped: {CHROMIUM} is absent (apt-get install -y chromium)"
    print(REASON, file=sys.stderr)
    pytest.skip(REASON, allow_module_level=True)

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServe]:
    root = tmp_path_factory.mktemp("console")
    profile = short_ttl_profile(root / "profile", "deploys.trigger", seconds=TTL_S)
    serve = HttpServe(root / "state", root / "serve.log", profile=profile, dev=True)
    try:
        serve.wait_ready()
        yield serve
    finally:
        assert serve.stop() == 0
        assert "Traceback" not in serve.log.read_text(), serve.log.read_text()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield chromium
        finally:
            chromium.close()


def new_page(browser: Browser, width: int = 1280, height: int = 800) -> Page:
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # Script errors and console errors such as a CSP violation; a refused request (4xx)
    # is logged too, and is expected where a test provokes a refusal.
    page.on(
        "console",
        lambda m: (
            errors.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource")
            else None
        ),
    )
    page.errors = errors  # type: ignore[attr-defined]
    return page


def no_page_errors(page: Page) -> None:
    errors: list[str] = page.errors  # type: ignore[attr-defined]
    assert errors == [], errors


def sign_in_as(page: Page, server: HttpServe, user: str) -> None:
    page.goto(server.url + "/")
    expect(page.locator("#dev-form")).to_be_visible()
    page.get_by_label("Sign in as a sample user").select_option(user)
    page.get_by_role("button", name="Sign in as this user").click()
    expect(page.locator("#who-text")).to_contain_text(f"{user} @")
    expect(page.locator("#live")).to_have_text("live")


def sign_in_with_token(page: Page, server: HttpServe, token: str) -> None:
    page.goto(server.url + "/")
    page.get_by_label("Session token").fill(token)
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.locator("#workspace")).to_be_visible()


def agent_proposes(
    server: HttpServe, token: str, tool: str, args: dict[str, Any], key: str | None = None
) -> dict[str, Any]:
    headers = {"Idempotency-Key": key} if key else {}
    with server.client(token) as c:
        r = c.post("/v1/proposals", json={"tool": tool, "args": args}, headers=headers)
    answer: dict[str, Any] = r.json()
    assert answer["outcome"] == "approval_required", answer
    return answer


def item(page: Page, invocation_id: str) -> Any:
    return page.locator(f'#pending-list button[data-id="{invocation_id}"]')


def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=True)
    target = os.environ.get("CALLGATE_SCREENSHOT_DIR")
    if target:
        shutil.copy(tmp_path / name, Path(target) / name)


def test_approver_approves_a_high_impact_refund_and_the_agent_executes(
    server: HttpServe, browser: Browser, tmp_path: Path
) -> None:
    alice = server.token("alice", "acme", "support")
    key = f"refund-{uuid.uuid4().hex[:8]}"
    answer = agent_proposes(server, alice, "refunds.issue", REFUND_BIG, key)
    inv = answer["invocation_id"]

    page = new_page(browser)
    sign_in_as(page, server, "fran")
    expect(item(page, inv)).to_be_visible()
    expect(item(page, inv)).to_contain_text("refunds.issue")
    expect(item(page, inv)).to_contain_text("ORD-77")
    item(page, inv).click()
    detail = page.locator("#detail")
    expect(detail.locator("#detail-h")).to_have_text("refunds.issue on ORD-77")
    dry = page.get_by_role("table", name="Dry run: what approving changes")
    expect(dry).to_contain_text("refundable_cents")
    expect(dry.locator("td.after.changed")).to_contain_text("9750.00 EUR")  # 10000 - 250
    binds = page.locator("#binds")
    expect(binds).to_contain_text("Policy version")
    expect(binds).to_contain_text("Dry-run hash")
    expect(binds.locator(".countdown")).to_have_text(re.compile(r"^1[45]:\d\d$"))
    iso = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"  # the command line's format too
    expect(binds).to_contain_text(re.compile(rf"Decide before\s*{iso} \(in "))
    expect(page.locator("#chain")).to_contain_text("Audit chain verified")
    screenshot(page, tmp_path, "console-desktop.png")

    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#detail-result")).to_contain_text("Approved.")
    expect(item(page, inv)).to_have_count(0)  # the item left the list (the live stream)

    with server.client(alice) as c:
        approval_id = c.get(f"/v1/invocations/{inv}").json()["approval"]["approval_id"]
        done = c.post(
            "/v1/proposals",
            json={"tool": "refunds.issue", "args": REFUND_BIG, "approval_id": approval_id},
            headers={"Idempotency-Key": key},
        ).json()
    assert done["outcome"] == "executed", done
    assert done["result"]["amount_cents"] == 25000

    page.get_by_label("Invocation id").fill(done["invocation_id"])
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#timeline")).to_contain_text("executed")
    expect(page.locator("#timeline")).to_contain_text("presented approval of fran")
    expect(page.locator("#chain")).to_contain_text("Audit chain verified")
    no_page_errors(page)
    page.close()


def test_approver_denies_with_a_reason_using_the_keyboard(
    server: HttpServe, browser: Browser
) -> None:
    alice = server.token("alice", "acme", "support")
    answer = agent_proposes(server, alice, "refunds.issue", {**REFUND_BIG, "order_id": "ORD-78"})
    inv = answer["invocation_id"]
    page = new_page(browser)
    sign_in_with_token(page, server, server.token("fran", "acme", "finance-approver"))
    expect(item(page, inv)).to_be_visible()
    item(page, inv).focus()
    page.keyboard.press("Enter")
    expect(page.locator("#detail-h")).to_have_text("refunds.issue on ORD-78")
    page.get_by_label("Reason (sent with a denial)").fill("order was already refunded")
    page.keyboard.press("Tab")  # from the reason to Approve
    page.keyboard.press("Tab")  # to Deny
    page.keyboard.press("Enter")
    expect(page.locator("#detail-result")).to_contain_text(
        "Denied: order was already refunded. The call will not run."
    )
    expect(item(page, inv)).to_have_count(0)
    with server.client(alice) as c:
        approval = c.get(f"/v1/invocations/{inv}").json()["approval"]
    assert approval["state"] == "denied" and approval["approver"] == "fran"
    no_page_errors(page)
    page.close()


def test_an_expired_item_counts_down_and_leaves_the_list(
    server: HttpServe, browser: Browser, tmp_path: Path
) -> None:
    rory = server.token("rory", "acme", "release")
    answer = agent_proposes(server, rory, "deploys.trigger", DEPLOY)
    inv = answer["invocation_id"]
    page = new_page(browser, 390, 844)
    sign_in_as(page, server, "rel")
    expect(item(page, inv)).to_be_visible()
    item(page, inv).click()
    expect(page.locator("#detail-h")).to_have_text("deploys.trigger on search")
    expect(page.locator("#dry-run")).to_contain_text("version")
    screenshot(page, tmp_path, "console-phone.png")
    expect(item(page, inv)).to_have_count(0, timeout=(TTL_S + 15) * 1000)
    expect(page.locator("#detail-result")).to_be_visible()
    expect(page.locator("#detail-result")).to_contain_text(
        re.compile("approval window|no longer pending")
    )
    expect(page.get_by_role("button", name="Approve", exact=True)).to_be_hidden()
    with server.client(rory) as c:
        assert c.get(f"/v1/invocations/{inv}").json()["approval"]["state"] == "expired"
    no_page_errors(page)
    page.close()


def test_refusals_are_shown_in_words(server: HttpServe, browser: Browser) -> None:
    sue = server.token("sue", "acme", "support", "finance-approver")
    answer = agent_proposes(server, sue, "refunds.issue", {**REFUND_BIG, "order_id": "ORD-79"})
    inv = answer["invocation_id"]
    page = new_page(browser)
    sign_in_as(page, server, "sue")
    item(page, inv).click()
    page.get_by_role("button", name="Approve", exact=True).click()
    result = page.locator("#detail-result")
    expect(result).to_contain_text("You proposed this call yourself")
    expect(item(page, inv)).to_be_visible()  # still pending: another approver must decide

    other = new_page(browser)
    sign_in_as(other, server, "alice")  # a support agent: no approver role
    item(other, inv).click()
    other.get_by_role("button", name="Approve", exact=True).click()
    expect(other.locator("#detail-result")).to_contain_text("do not hold an approver role")

    with server.client(server.token("fran", "acme", "finance-approver")) as c:
        assert c.post(f"/v1/invocations/{inv}/deny", json={"reason": "x"}).status_code == 200
    # The stream removes it from both consoles; a stale click would be not_pending.
    expect(item(page, inv)).to_have_count(0)
    expect(result).to_be_visible()
    no_page_errors(page)
    no_page_errors(other)
    page.close()
    other.close()


def test_a_bad_token_is_refused_in_words(server: HttpServe, browser: Browser) -> None:
    page = new_page(browser)
    page.goto(server.url + "/")
    page.get_by_label("Session token").fill("not-a-token")
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.get_by_role("alert")).to_contain_text("Your session is not valid")
    expect(page.locator("#workspace")).to_be_hidden()
    page.close()


def test_not_pending_is_shown_in_words(server: HttpServe, browser: Browser) -> None:
    """A console whose stream is cut (so its list is stale) clicks after another approver."""
    alice = server.token("alice", "acme", "support")
    answer = agent_proposes(server, alice, "refunds.issue", {**REFUND_BIG, "order_id": "ORD-80"})
    inv = answer["invocation_id"]
    page = new_page(browser)
    page.route("**/v1/pending/events", lambda route: route.abort())
    sign_in_with_token(page, server, server.token("fran", "acme", "finance-approver"))
    expect(page.locator("#live")).to_have_text("reconnecting…")
    item(page, inv).click()
    with server.client(server.token("fern", "acme", "finance-approver")) as c:
        assert c.post(f"/v1/invocations/{inv}/approve").status_code == 200
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#detail-result")).to_contain_text(
        "This call is no longer pending: it was already decided, or it expired."
    )
    no_page_errors(page)
    page.close()
