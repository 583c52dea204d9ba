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

from tests.http_support import CHROMIUM, REFUND_BIG, HttpServe, short_ttl_profile

pytestmark = pytest.mark.browser

DEPLOY = {"service": "search", "version": "7.0.0", "environment": "production"}
TTL_S = 8

if not CHROMIUM.exists():
    REASON = f"browser tests skipped: {CHROMIUM} is absent (apt-get install -y chromium)"
    print(REASON, file=sys.stderr)
    pytest.skip(REASON, allow_module_level=True)

from playwright.sync_api import Browser, Page, Route, expect  # noqa: E402


@pytest.fixture(scope="module")
def console_http_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServe]:
    root = tmp_path_factory.mktemp("console")
    profile = short_ttl_profile(root / "profile", "deploys.trigger", seconds=TTL_S)
    serve = HttpServe(root / "state", root / "serve.log", profile=profile, dev=True)
    try:
        serve.wait_ready()
        yield serve
    finally:
        assert serve.stop() == 0
        assert "Traceback" not in serve.log.read_text(), serve.log.read_text()


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


def sign_in_as(page: Page, console_http_serve: HttpServe, user: str, at: str = "/") -> None:
    """Sign in as a sample user on the console at ``at`` (a link to an invocation too)."""
    page.goto(console_http_serve.url + at)
    expect(page.locator("#dev-form")).to_be_visible()
    page.get_by_label("Sign in as a sample user").select_option(user)
    page.get_by_role("button", name="Sign in as this user").click()
    expect(page.locator("#who-text")).to_contain_text(f"{user} @")
    expect(page.locator("#live")).to_have_text("live")


def sign_in_with_token(page: Page, console_http_serve: HttpServe, token: str) -> None:
    page.goto(console_http_serve.url + "/")
    page.get_by_label("Session token").fill(token)
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.locator("#workspace")).to_be_visible()


def agent_proposes(
    console_http_serve: HttpServe,
    token: str,
    tool: str,
    args: dict[str, Any],
    key: str | None = None,
) -> dict[str, Any]:
    headers = {"Idempotency-Key": key} if key else {}
    with console_http_serve.client(token) as c:
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
    console_http_serve: HttpServe, browser: Browser, tmp_path: Path
) -> None:
    alice = console_http_serve.token("alice", "acme", "support")
    key = f"refund-{uuid.uuid4().hex[:8]}"
    answer = agent_proposes(console_http_serve, alice, "refunds.issue", REFUND_BIG, key)
    inv = answer["invocation_id"]

    page = new_page(browser)
    sign_in_as(page, console_http_serve, "fran")
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
    expect(page.locator("#detail-result")).to_contain_text("Approved. The call ran: executed.")
    expect(item(page, inv)).to_have_count(0)  # the item left the list (the live stream)
    live = page.locator("#live-state")
    expect(live).to_contain_text("Executed")
    expect(live).to_contain_text("Approval id")

    # ADR 0029: the approved call ran without any resubmission
    with console_http_serve.client(alice) as c:
        done = c.get(f"/v1/invocations/{inv}", params={"wait": 30}).json()
    assert done["outcome"] == "executed" and done["final"] is True, done
    assert done["result"]["amount_cents"] == 25000

    page.get_by_label("Invocation id").fill(done["invocation_id"])
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#timeline")).to_contain_text("executed")
    expect(page.locator("#timeline")).to_contain_text("presented approval of fran")
    expect(page.locator("#chain")).to_contain_text("Audit chain verified")
    no_page_errors(page)
    page.close()


def test_approver_denies_with_a_reason_using_the_keyboard(
    console_http_serve: HttpServe, browser: Browser
) -> None:
    alice = console_http_serve.token("alice", "acme", "support")
    answer = agent_proposes(
        console_http_serve, alice, "refunds.issue", {**REFUND_BIG, "order_id": "ORD-78"}
    )
    inv = answer["invocation_id"]
    page = new_page(browser)
    sign_in_with_token(
        page, console_http_serve, console_http_serve.token("fran", "acme", "finance-approver")
    )
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
    with console_http_serve.client(alice) as c:
        approval = c.get(f"/v1/invocations/{inv}").json()["approval"]
    assert approval["state"] == "denied" and approval["approver"] == "fran"
    no_page_errors(page)
    page.close()


def test_an_expired_item_counts_down_and_leaves_the_list(
    console_http_serve: HttpServe, browser: Browser, tmp_path: Path
) -> None:
    rory = console_http_serve.token("rory", "acme", "release")
    answer = agent_proposes(console_http_serve, rory, "deploys.trigger", DEPLOY)
    inv = answer["invocation_id"]
    page = new_page(browser, 390, 844)
    sign_in_as(page, console_http_serve, "rel")
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
    with console_http_serve.client(rory) as c:
        assert c.get(f"/v1/invocations/{inv}").json()["approval"]["state"] == "expired"
    no_page_errors(page)
    page.close()


def test_refusals_are_shown_in_words(console_http_serve: HttpServe, browser: Browser) -> None:
    sue = console_http_serve.token("sue", "acme", "support", "finance-approver")
    answer = agent_proposes(
        console_http_serve, sue, "refunds.issue", {**REFUND_BIG, "order_id": "ORD-79"}
    )
    inv = answer["invocation_id"]
    page = new_page(browser)
    sign_in_as(page, console_http_serve, "sue")
    item(page, inv).click()
    page.get_by_role("button", name="Approve", exact=True).click()
    result = page.locator("#detail-result")
    expect(result).to_contain_text("You proposed this call yourself")
    expect(item(page, inv)).to_be_visible()  # still pending: another approver must decide

    other = new_page(browser)
    sign_in_as(other, console_http_serve, "alice")  # a support agent: no approver role
    item(other, inv).click()
    other.get_by_role("button", name="Approve", exact=True).click()
    expect(other.locator("#detail-result")).to_contain_text("do not hold an approver role")

    with console_http_serve.client(
        console_http_serve.token("fran", "acme", "finance-approver")
    ) as c:
        assert c.post(f"/v1/invocations/{inv}/deny", json={"reason": "x"}).status_code == 200
    # The stream removes it from both consoles; a stale click would be not_pending.
    expect(item(page, inv)).to_have_count(0)
    expect(result).to_be_visible()
    no_page_errors(page)
    no_page_errors(other)
    page.close()
    other.close()


def test_a_bad_token_is_refused_in_words(console_http_serve: HttpServe, browser: Browser) -> None:
    page = new_page(browser)
    page.goto(console_http_serve.url + "/")
    page.get_by_label("Session token").fill("not-a-token")
    page.get_by_role("button", name="Sign in", exact=True).click()
    expect(page.get_by_role("alert")).to_contain_text("Your session is not valid")
    expect(page.locator("#workspace")).to_be_hidden()
    page.close()


def test_not_pending_is_shown_in_words(console_http_serve: HttpServe, browser: Browser) -> None:
    """A console whose stream is cut (so its list is stale) clicks after another approver."""
    alice = console_http_serve.token("alice", "acme", "support")
    answer = agent_proposes(
        console_http_serve, alice, "refunds.issue", {**REFUND_BIG, "order_id": "ORD-80"}
    )
    inv = answer["invocation_id"]
    page = new_page(browser)
    page.route("**/v1/pending/events", lambda route: route.abort())
    sign_in_with_token(
        page, console_http_serve, console_http_serve.token("fran", "acme", "finance-approver")
    )
    expect(page.locator("#live")).to_have_text("reconnecting…")
    item(page, inv).click()
    with console_http_serve.client(
        console_http_serve.token("fern", "acme", "finance-approver")
    ) as c:
        assert c.post(f"/v1/invocations/{inv}/approve").status_code == 200
    page.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#detail-result")).to_contain_text(
        "This call is no longer pending: it was already decided, or it expired."
    )
    no_page_errors(page)
    page.close()


def test_a_link_opens_a_pending_two_of_n_deploy_live(browser: Browser, tmp_path: Path) -> None:
    """ADR 0029, 0030: ``/#invocation=<id>`` and ``/invocations/<id>`` open the item; the
    list shows its key figure and "1 of 2"; Approve and Deny fit a 1280x800 screen; the
    second grant runs the deploy and the page shows it executed (the shipped profile)."""
    serve = HttpServe(tmp_path / "state", tmp_path / "serve.log", dev=True)
    try:
        serve.wait_ready()
        rory = serve.token("rory", "acme", "release")
        mona = serve.token("mona", "acme", "release-manager")
        answer = agent_proposes(serve, rory, "deploys.trigger", DEPLOY)
        inv = answer["invocation_id"]
        with serve.client(mona) as c:
            granted = c.post(f"/v1/invocations/{inv}/approve").json()
        assert granted == {"invocation_id": inv, "granted": 1, "required": 2}

        page = new_page(browser)
        sign_in_as(page, serve, "rel", at=f"/#invocation={inv}")
        expect(item(page, inv)).to_contain_text("production 7.0.0")
        expect(item(page, inv)).to_contain_text("1 of 2 granted (mona)")
        expect(page.locator("#facts")).to_contain_text("1 of 2 granted (mona)")
        live = page.locator("#live-state")
        expect(live).to_contain_text("Pending approval")
        expect(live).to_contain_text("1 of 2 granted (mona)")
        for name in ("Approve", "Deny"):
            box = page.get_by_role("button", name=name, exact=True).bounding_box()
            assert box is not None and box["y"] + box["height"] <= 800, (name, box)
        screenshot(page, tmp_path, "console-quorum-desktop.png")

        phone = new_page(browser, 390, 844)
        sign_in_as(phone, serve, "rel", at=f"/invocations/{inv}")
        expect(phone.locator("#live-state")).to_contain_text("1 of 2 granted (mona)")
        screenshot(phone, tmp_path, "console-quorum-phone.png")
        no_page_errors(phone)
        phone.close()

        page.get_by_role("button", name="Approve", exact=True).click()
        expect(page.locator("#detail-result")).to_contain_text("The call ran: executed.")
        expect(live).to_contain_text("Executed")
        expect(live).to_contain_text("granted by mona, rel")
        no_page_errors(page)
        page.close()
    finally:
        assert serve.stop() == 0, serve.log.read_text()


def test_an_operator_sees_the_shadow_policys_disagreements(
    browser: Browser, tmp_path: Path
) -> None:
    """ADR 0050: a refund the shadow version forbids is listed for an operator, with the
    outcome it kept; a user without the operator role sees no shadow card."""
    from tests.e2e.helpers import cg
    from tests.e2e.test_policy_simulate import FORBID_OVER_500_EUR, candidate_profile

    serve = HttpServe(tmp_path / "state", tmp_path / "serve.log", dev=True)
    try:
        serve.wait_ready()
        operator = serve.token("olga", "ops", "callgate-operator")
        candidate = candidate_profile(tmp_path, FORBID_OVER_500_EUR)
        version = cg(serve.state_dir, "policy", "publish", str(candidate), "--session",
                     operator, "--reason", "cap")["published"]  # fmt: skip
        cg(serve.state_dir, "policy", "shadow", version, "--session", operator)
        alice = serve.token("alice", "acme", "support")
        args = {"order_id": "ORD-7", "amount_cents": 90_000, "currency": "EUR",
                "issued_by": "alice"}  # fmt: skip
        answer = agent_proposes(serve, alice, "refunds.issue", args)

        page = new_page(browser)
        sign_in_with_token(page, serve, operator)
        expect(page.locator("#shadow-count")).to_have_text("1")
        row = page.locator("#shadow-rows tr")
        expect(row).to_contain_text(answer["invocation_id"])
        expect(row).to_contain_text("approval_required")
        expect(row).to_contain_text("tool_forbidden")
        no_page_errors(page)
        page.close()

        page = new_page(browser)
        sign_in_with_token(page, serve, alice)
        expect(page.locator("#shadow")).to_be_hidden()
        no_page_errors(page)
        page.close()
    finally:
        assert serve.stop() == 0, serve.log.read_text()


def test_signing_out_while_the_pending_list_loads_ends_that_sign_in_quietly(
    console_http_serve: HttpServe, browser: Browser
) -> None:
    """Signing in enters the workspace and asks for the pending list; the approver signs
    out before it comes (a slow backend): the late list neither re-enters the workspace
    nor fails on the signed-out session (an alarm here; an uncaught error after a
    reload, whose sign-in is the session cookie's)."""
    page = new_page(browser)
    held: list[Route] = []
    page.route("**/v1/pending", lambda route: held.append(route))
    page.goto(console_http_serve.url + "/")
    page.get_by_label("Sign in as a sample user").select_option("fran")
    page.get_by_role("button", name="Sign in as this user").click()
    expect(page.locator("#who-text")).to_contain_text("fran @")
    page.get_by_role("button", name="Sign out").click()
    expect(page.locator("#dev-form")).to_be_visible()
    page.wait_for_function("true")  # the held request is in
    assert len(held) == 1
    with page.expect_response("**/v1/pending"):
        held[0].continue_()
    page.evaluate("() => new Promise((done) => setTimeout(done, 50))")  # enter() resumes
    expect(page.locator("#workspace")).to_be_hidden()
    expect(page.locator("#alert")).to_be_hidden()
    no_page_errors(page)
    page.close()


def test_the_actors_usage_is_shown_beside_a_pending_refund(
    browser: Browser, tmp_path: Path
) -> None:
    """ADR 0079: beside alice's pending refund, the approver sees the usage of the limits
    that refund counts in: alice's, not bob's, not a limit of another tool; held and
    committed, against each limit, with its window; and what the call adds to the limit
    that asked for the approval (``over: approve``)."""
    from tests.limits_support import REFUND_LIMIT, TICKET_LIMIT, limited_profile, refund

    review = {**REFUND_LIMIT, "name": "refunds-review", "max": 60_000, "over": "approve"}
    profile = limited_profile(tmp_path / "profile", REFUND_LIMIT, review, TICKET_LIMIT)
    serve = HttpServe(tmp_path / "state", tmp_path / "serve.log", profile=profile, dev=True)
    try:
        serve.wait_ready()
        alice, bob = serve.token("alice", "acme", "support"), serve.token("bob", "acme", "support")
        with serve.client(alice) as a, serve.client(bob) as b:
            for i in range(5):  # 49,995 of alice's budgets committed
                ran = a.post("/v1/proposals", json={"tool": "refunds.issue", "args": refund(i)})
                assert ran.json()["outcome"] == "executed", ran.text
            ran = b.post("/v1/proposals", json={"tool": "refunds.issue", "args": refund(9)})
            assert ran.json()["outcome"] == "executed", ran.text
            ticket = {"title": "t", "requester_id": "alice"}
            ran = a.post("/v1/proposals", json={"tool": "tickets.create", "args": ticket})
            assert ran.json()["outcome"] == "executed", ran.text
        answer = agent_proposes(serve, alice, "refunds.issue", REFUND_BIG)  # holds 25,000
        inv = answer["invocation_id"]

        page = new_page(browser)
        sign_in_as(page, serve, "fran")
        item(page, inv).click()
        card = page.get_by_role("table", name="Usage of the actor's limits")
        expect(card).to_be_visible()
        rows = card.locator("tbody tr")
        expect(rows).to_have_count(2)  # bob's scopes and the ticket limit are not shown
        per_actor = rows.filter(has_text="refunds-per-actor")
        expect(per_actor).to_contain_text("actor alice")
        expect(per_actor).to_contain_text("74,995 of 100,000")
        expect(per_actor).to_contain_text("(25,000 held)")
        expect(per_actor).to_contain_text("24h")
        expect(per_actor.locator("meter")).to_have_attribute("value", "74995")
        reviewed = rows.filter(has_text="refunds-review")
        expect(reviewed).to_contain_text("74,995 of 60,000")
        expect(reviewed).to_contain_text("This call: +25,000, over the limit")
        expect(card).not_to_contain_text("bob")
        screenshot(page, tmp_path, "console-usage-desktop.png")

        page.get_by_role("button", name="Deny", exact=True).click()
        expect(page.locator("#detail-result")).to_contain_text("Denied")
        expect(card).to_be_hidden()  # the call left the list: no card beside nothing
        with serve.client(alice) as a:
            mine = a.get("/v1/usage", params={"actor": "alice", "tool": "refunds.issue"}).json()
        assert sorted((r["limit"], r["used"], r["held"]) for r in mine) == [
            ("refunds-per-actor", 49_995, 0),
            ("refunds-review", 49_995, 0),
        ]  # the denial released the hold
        no_page_errors(page)
        page.close()
    finally:
        assert serve.stop() == 0, serve.log.read_text()
