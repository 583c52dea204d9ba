"""The HTTP API on the embedded backend, through a real client against a real server.

``callgate serve --http`` runs as a subprocess (uvicorn on loopback); httpx talks to it.
One server for the module in development mode, so that it trusts the development
issuer's tokens the tests mint (the default profile, with ``deploys.trigger`` approvals
that expire after a few seconds); a second one, not in development mode, with a tiny
rate limit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from callgate.adapters.embedded.store import EmbeddedStore
from callgate.domain.codes import Code
from callgate.surfaces.http.errors import STATUS
from callgate.surfaces.http.guard import CSP
from tests.e2e.helpers import cg, propose_argv
from tests.http import approval_flow
from tests.http_support import (
    REFUND_BIG,
    HttpServe,
    bearer,
    running,
    short_ttl_profile,
    wait_until,
)

DEPLOY = {"service": "checkout", "version": "2.4.1", "environment": "production"}


@pytest.fixture(scope="module")
def embedded_http_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServe]:
    root = tmp_path_factory.mktemp("http-embedded")
    profile = short_ttl_profile(root / "profile", "deploys.trigger", seconds=3)
    serve = HttpServe(root / "state", root / "serve.log", profile=profile, dev=True)
    with running(serve):
        yield serve


def post(c: httpx.Client, path: str, body: Any = None, **kw: Any) -> httpx.Response:
    return c.post(path, json=body, **kw)


def propose(
    embedded_http_serve: HttpServe, token: str, tool: str, args: dict[str, Any], **kw: Any
) -> Any:
    """``POST /v1/proposals``; the status is the outcome's (200 executed, 403 forbidden...)."""
    with embedded_http_serve.client(token) as c:
        r = post(c, "/v1/proposals", {"tool": tool, "args": args, **kw.pop("body", {})}, **kw)
    answer = r.json()
    assert r.status_code == STATUS[Code(answer["outcome"])], r.text
    assert ("error" in answer) == (r.status_code >= 400), r.text
    return answer


# --- operations and the guards ------------------------------------------------------------


def test_health_ready_and_security_headers(embedded_http_serve: HttpServe) -> None:
    with embedded_http_serve.client() as c:
        assert c.get("/healthz").json()["status"] == "ok"
        r = c.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "ready"
        page = c.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for response in (r, page):
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
    assert "frame-ancestors 'none'" in CSP and "unsafe-inline" not in CSP
    assert "<script>" not in page.text and 'type="module" src="/console/console.js"' in page.text
    assert "set-cookie" not in page.headers


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": "Basic YWxpY2U6c2VjcmV0"},
    ],
)
def test_no_valid_session_is_401_unauthenticated(
    embedded_http_serve: HttpServe, headers: dict[str, str]
) -> None:
    with httpx.Client(base_url=embedded_http_serve.url, headers=headers) as c:
        for method, path in [
            ("GET", "/v1/pending"),
            ("GET", "/v1/audit"),
            ("GET", "/v1/invocations/x"),
            ("POST", "/v1/invocations/x/approve"),
        ]:
            r = c.request(method, path)
            assert r.status_code == 401, (path, r.text)
            assert r.json()["error"]["code"] == "unauthenticated"
        r = c.post("/v1/proposals", json={"tool": "tickets.read", "args": {"ticket_id": "T-1"}})
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"


def test_a_token_in_a_cookie_or_the_query_is_not_a_session(embedded_http_serve: HttpServe) -> None:
    token = embedded_http_serve.token("alice", "acme", "support")
    with httpx.Client(base_url=embedded_http_serve.url, cookies={"session": token}) as c:
        assert c.get("/v1/pending").status_code == 401
        assert c.get("/v1/pending", params={"token": token}).status_code == 401


def test_malformed_and_oversized_requests_are_coded(embedded_http_serve: HttpServe) -> None:
    token = embedded_http_serve.token("alice", "acme", "support")
    with embedded_http_serve.client(token) as c:
        r = c.post(
            "/v1/proposals", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
        r = c.post("/v1/proposals", json={"args": {}})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
        big = {"tool": "tickets.read", "args": {"ticket_id": "x" * 70_000}}
        r = c.post("/v1/proposals", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
            yield b'{"tool": "tickets.read", "args": {"ticket_id": "'
            for _ in range(80):
                yield b"y" * 1024
            yield b'"}}'

        r = c.post("/v1/proposals", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        r = c.get("/v1/nothing-here")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = c.delete("/v1/pending")
        assert r.status_code == 405 and r.json()["error"]["code"] == "invalid_request"
    for response in (r,):
        assert "Traceback" not in response.text


def test_cors_is_closed_by_default(embedded_http_serve: HttpServe) -> None:
    with embedded_http_serve.client() as c:
        r = c.get("/healthz", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers
        r = c.options(
            "/v1/proposals",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers


def test_dev_sign_in_issues_tokens_of_sample_users(embedded_http_serve: HttpServe) -> None:
    with embedded_http_serve.client() as c:
        users = c.get("/v1/dev/users").json()
        assert {"user": "fran", "tenant": "acme", "roles": ["finance-approver"]} in users
        token = c.post("/v1/dev/sessions", json={"user": "fran"}).json()["token"]
        r = c.post("/v1/dev/sessions", json={"user": "mallory"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    with embedded_http_serve.client(token) as c:
        me = c.get("/v1/session").json()
    assert (me["user"], me["tenant"], me["roles"]) == ("fran", "acme", ["finance-approver"])


# --- proposals ----------------------------------------------------------------------------


def test_propose_answers_what_callgate_propose_answers(embedded_http_serve: HttpServe) -> None:
    token = embedded_http_serve.token("alice", "acme", "support")
    api = propose(embedded_http_serve, token, "tickets.read", {"ticket_id": "T-5"})
    cli = cg(
        embedded_http_serve.state_dir, *propose_argv(token, "tickets.read", '{"ticket_id": "T-5"}')
    )
    assert api["outcome"] == cli["outcome"] == "executed"
    assert set(api) == set(cli) and api["result"] == cli["result"]
    forbidden = propose(embedded_http_serve, token, "users.delete", {"user_id": "U-1"})
    assert forbidden["outcome"] == "tool_forbidden"
    assert forbidden["error"]["code"] == "tool_forbidden"


def test_propose_waits_a_bounded_time_then_202_with_the_invocation_url(
    tmp_path: Path,
) -> None:
    # The tickets provider takes 3 s per call, so a 0.2 s wait cannot see the outcome.
    slow = HttpServe(
        tmp_path / "state",
        tmp_path / "serve.log",
        env={"CALLGATE_FAULTS": '{"tickets": {"latency_ms": 3000}}'},
        dev=True,
    )
    try:
        slow.wait_ready()
        token = slow.token("alice", "acme", "support")
        with slow.client(token) as c:
            started = time.monotonic()
            r = c.post(
                "/v1/proposals",
                params={"wait": 0.2},
                json={"tool": "tickets.read", "args": {"ticket_id": "T-9"}},
            )
            assert time.monotonic() - started < 2.5, "the wait is bounded by ?wait"
            assert r.status_code == 202, r.text
            body = r.json()
            assert body["settled"] is False
            where = r.headers["location"]
            assert where == f"/v1/invocations/{body['invocation_id']}"
            assert c.get(where).status_code == 200  # in progress or settled, never "not found"
            with slow.client(slow.token("gina", "globex", "support")) as other:
                assert other.get(where).status_code == 404
            wait_until(lambda: c.get(where).json().get("settled") is True, 20, "the call to settle")
            assert c.get(where).json()["outcome"] == "executed"
    finally:
        assert slow.stop() == 0, slow.log.read_text()


def test_high_impact_refund_approved_over_http_executes_once(
    embedded_http_serve: HttpServe,
) -> None:
    """ADR 0029: the agent's ``propose --wait`` prints ``executed`` after an approval over
    HTTP, without any resubmission; one effect; the resubmission replays (V2)."""
    approval_flow.refund_approved_over_http_runs_without_resubmission(embedded_http_serve)


def test_deploy_to_production_needs_two_distinct_release_managers(tmp_path: Path) -> None:
    """ADR 0030: pending after one grant, refused twice and to the respelled actor, executed
    after the second (the shipped profile: this module's server expires deploys early)."""
    serve = HttpServe(tmp_path / "state", tmp_path / "serve.log", dev=True)
    with running(serve):
        approval_flow.deploy_needs_two_distinct_release_managers(serve)


def test_refusals_are_coded(embedded_http_serve: HttpServe) -> None:
    sue = embedded_http_serve.token(
        "sue", "acme", "support", "finance-approver"
    )  # caller and approver
    other = embedded_http_serve.token("sam", "acme", "support")  # no approver role
    fran = embedded_http_serve.token("fran", "acme", "finance-approver")
    big = propose(embedded_http_serve, sue, "refunds.issue", {**REFUND_BIG, "order_id": "ORD-81"})
    inv = big["invocation_id"]
    with embedded_http_serve.client(sue) as c:
        r = c.post(f"/v1/invocations/{inv}/approve")  # self-approval of a high-impact call
        assert r.status_code == 403 and r.json()["error"]["code"] == "approver_forbidden"
        assert "own call" in r.json()["error"]["message"]
    with embedded_http_serve.client(other) as c:
        r = c.post(f"/v1/invocations/{inv}/approve")
        assert r.status_code == 403 and r.json()["error"]["code"] == "approver_forbidden"
    with embedded_http_serve.client(fran) as c:
        r = c.post(f"/v1/invocations/{inv}/deny", json={"reason": "duplicate refund"})
        assert r.status_code == 200, r.text
        assert r.json() == {"invocation_id": inv, "denied": True, "reason": "duplicate refund"}
        r = c.post(f"/v1/invocations/{inv}/approve")
        assert r.status_code == 409 and r.json()["error"]["code"] == "not_pending"


def test_an_expired_approval_cannot_be_given(embedded_http_serve: HttpServe) -> None:
    rory = embedded_http_serve.token("rory", "acme", "release")
    rel = embedded_http_serve.token("rel", "acme", "release-manager")
    answer = propose(embedded_http_serve, rory, "deploys.trigger", DEPLOY)
    assert answer["outcome"] == "approval_required"
    inv = answer["invocation_id"]
    with embedded_http_serve.client(rel) as c:
        assert any(p["invocation_id"] == inv for p in c.get("/v1/pending").json())
        wait_until(
            lambda: all(p["invocation_id"] != inv for p in c.get("/v1/pending").json()),
            20,
            "the approval to expire",
        )
        r = c.post(f"/v1/invocations/{inv}/approve")
        assert r.status_code == 409
        assert r.json()["error"]["code"] in {"approval_expired", "not_pending"}
        assert c.get(f"/v1/invocations/{inv}").json()["approval"]["state"] == "expired"


# --- tenants ------------------------------------------------------------------------------


def test_reads_and_writes_are_scoped_to_the_bearers_tenant(embedded_http_serve: HttpServe) -> None:
    alice = embedded_http_serve.token("alice", "acme", "support")
    gina = embedded_http_serve.token("gina", "globex", "support", "finance-approver")
    mine = propose(
        embedded_http_serve, alice, "refunds.issue", {**REFUND_BIG, "order_id": "ORD-90"}
    )
    inv = mine["invocation_id"]
    with embedded_http_serve.client(gina) as c:
        for path in (f"/v1/invocations/{inv}",):
            r = c.get(path)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        for action in ("approve", "deny"):
            r = c.post(f"/v1/invocations/{inv}/{action}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert all(p["tenant"] == "globex" for p in c.get("/v1/pending").json())
        assert c.get("/v1/audit", params={"invocation": inv}).json() == []
        tenants = {r["authorized_by"]["principal"]["tenant"] for r in c.get("/v1/audit").json()}
        assert tenants <= {"globex"}
    with embedded_http_serve.client(alice) as c:
        assert c.get(f"/v1/invocations/{inv}").status_code == 200
        assert any(p["invocation_id"] == inv for p in c.get("/v1/pending").json())


# --- the event stream and metrics -----------------------------------------------------------


def test_the_pending_stream_follows_the_tenants_changes(embedded_http_serve: HttpServe) -> None:
    alice = embedded_http_serve.token("alice", "acme", "support")
    gina = embedded_http_serve.token("gina", "globex", "support")
    seen: list[list[dict[str, Any]]] = []
    with (
        httpx.Client(base_url=embedded_http_serve.url, headers=bearer(alice), timeout=30) as c,
        c.stream("GET", "/v1/pending/events") as stream,
    ):
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()

        def next_snapshot() -> list[dict[str, Any]]:
            event = None
            for line in lines:
                if line.startswith("event:"):
                    event = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and event == "pending":
                    rows: list[dict[str, Any]] = json.loads(line.split(":", 1)[1])
                    seen.append(rows)
                    return rows
            raise AssertionError("the stream ended")

        next_snapshot()
        other = propose(
            embedded_http_serve, gina, "refunds.issue", {**REFUND_BIG, "order_id": "GORD-1"}
        )
        new = propose(
            embedded_http_serve, alice, "refunds.issue", {**REFUND_BIG, "order_id": "ORD-91"}
        )
        # Earlier tests' items may expire or settle meanwhile, each a snapshot of its own;
        # the new item shows up in one of the next few.
        deadline = time.monotonic() + 20
        while new["invocation_id"] not in {r["invocation_id"] for r in next_snapshot()}:
            assert time.monotonic() < deadline, "the new pending item never streamed"
        assert all(r["tenant"] == "acme" for snapshot in seen for r in snapshot)
        assert other["invocation_id"] not in {r["invocation_id"] for s in seen for r in s}
    with embedded_http_serve.client(
        embedded_http_serve.token("fran", "acme", "finance-approver")
    ) as c:
        assert c.post(f"/v1/invocations/{new['invocation_id']}/deny").status_code == 200


def test_metrics_in_the_prometheus_format(embedded_http_serve: HttpServe) -> None:
    alice = embedded_http_serve.token("alice", "acme", "support")
    propose(embedded_http_serve, alice, "tickets.read", {"ticket_id": "T-77"})
    with embedded_http_serve.client() as c:
        text = c.get("/metrics").text
    assert 'callgate_decisions{code="executed",tool="tickets.read"}' in text
    assert 'callgate_decision_latency_seconds_bucket{le="+Inf",tool="tickets.read"}' in text
    assert "callgate_pending_approvals" in text
    assert 'callgate_consumer_lag{process="invocations"}' in text
    assert "callgate_dead_letters 0.0" in text
    poison = EmbeddedStore(embedded_http_serve.state_dir)  # a record no decoder can read
    try:
        poison.append_raw("requests", "i-poison", b"\x00not avro")
    finally:
        poison.close()
    with embedded_http_serve.client() as c:
        wait_until(
            lambda: "callgate_dead_letters 1.0" in c.get("/metrics").text, 20, "the dead letter"
        )


def test_every_code_has_a_documented_status() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "http-api.md").read_text()
    for code in Code:
        assert code in STATUS, code
        assert f"| `{code.value}` | {STATUS[code]} |" in guide, code


# --- the rate limit -------------------------------------------------------------------------


def test_without_development_mode_no_dev_routes_and_a_rate_limit(tmp_path: Path) -> None:
    """Not in development mode: the sample-user routes do not exist. The rate limit runs
    before authentication, so made-up bearers exercise it."""
    env = {"CALLGATE_HTTP_RATE_PER_S": "0.5", "CALLGATE_HTTP_RATE_BURST": "3"}
    serve = HttpServe(tmp_path / "state", tmp_path / "serve.log", env=env)
    try:
        serve.wait_ready()
        with serve.client() as c:
            assert c.get("/v1/dev/users").status_code == 404
            assert c.post("/v1/dev/sessions", json={"user": "alice"}).status_code == 404
        with serve.client("client-one") as c:
            codes = [c.get("/v1/pending").status_code for _ in range(3)]
            assert codes == [401, 401, 401]
            r = c.get("/v1/pending")
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
            assert int(r.headers["retry-after"]) >= 1
            assert c.get("/healthz").status_code == 200  # operations are not limited
        with serve.client("client-two") as other:
            assert other.get("/v1/pending").status_code == 401  # a bucket per bearer
            # ... and one per address, four times larger: made-up bearers do not dodge it
            codes = [other.get("/v1/pending").status_code for _ in range(12)]
            assert 429 in codes
    finally:
        assert serve.stop() == 0


def test_serve_http_with_a_bad_address_is_misuse(tmp_path: Path) -> None:
    from tests.e2e.helpers import EXIT_MISUSE, run

    result = run(tmp_path, "serve", "--http", "localhost", rc=EXIT_MISUSE, json_mode=False)
    assert "HOST:PORT" in result.stderr


# --- one strict reader, exact identifiers (issue 25) ----------------------------------------

FULLWIDTH_ACME = "\uff41\uff43\uff4d\uff45"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"tool": "tickets.read", "tool": "deploys.trigger", "args": {}}', "duplicate key"),
        (b'{"tool": "tickets.read", "args": {"ticket_id": "T-1", "ticket_id": "GT-1"}}', "dup"),
        (b'{"tool": "tickets.read", "t\\u006fol": "deploys.trigger", "args": {}}', "duplicate"),
        (b'{"tool": "tickets.read", "args": {"ticket_id": NaN}}', "NaN"),
        (b'{"tool": "tickets.read", "args": {"ticket_id": "\\ud800"}}', "surrogate"),
        (b'{"tool": "tickets.read", "args": {"n": 1e400}}', "not finite"),
    ],
    ids=["envelope", "arguments", "escaped-key", "nan", "lone-surrogate", "infinite"],
)
def test_the_strict_reader_refuses_what_parsers_could_read_differently(
    embedded_http_serve: HttpServe, body: bytes, says: str
) -> None:
    """A proxy keeping the first duplicate would see another request than callgate: such a
    body is 422 invalid_request before any route runs, and nothing is published."""
    token = embedded_http_serve.token("alice", "acme", "support", "admin")
    with embedded_http_serve.client(token) as c:
        before = len(c.get("/v1/audit").json())
        r = c.post("/v1/proposals", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_request"
        assert says in r.json()["error"]["message"]
        assert len(c.get("/v1/audit").json()) == before


@pytest.mark.parametrize(
    ("tenant", "code"),
    [("ACME", "tool_forbidden"), ("Acme", "tool_forbidden"), ("acme ", "unauthenticated"),
     (FULLWIDTH_ACME, "tool_forbidden")],
)  # fmt: skip
def test_another_spelling_of_a_tenant_reads_nothing_of_it(
    embedded_http_serve: HttpServe, tenant: str, code: str
) -> None:
    token = embedded_http_serve.token("alice", tenant, "support")
    with embedded_http_serve.client(token) as c:
        r = post(c, "/v1/proposals", {"tool": "tickets.read", "args": {"ticket_id": "T-1"}})
        assert r.json().get("outcome", r.json()["error"]["code"]) == code, r.text
        assert r.status_code == STATUS[Code(code)]
        if code == "tool_forbidden":
            assert c.get("/v1/pending").json() == []
            assert all(
                rec["authorized_by"]["principal"]["tenant"] == tenant
                for rec in c.get("/v1/audit").json()
            )


@pytest.mark.parametrize(
    ("role", "code"),
    [("ADMIN", "tool_forbidden"), ("Admin", "tool_forbidden"), (" admin", "unauthenticated")],
)
def test_another_spelling_of_a_role_is_not_the_role(
    embedded_http_serve: HttpServe, role: str, code: str
) -> None:
    token = embedded_http_serve.token("adam", "acme", role)
    with embedded_http_serve.client(token) as c:
        r = post(c, "/v1/proposals", {"tool": "users.delete", "args": {"user_id": "U-1"}})
    assert r.json().get("outcome", r.json()["error"]["code"]) == code, r.text


def test_an_approver_under_a_look_alike_of_the_actor_is_refused(
    embedded_http_serve: HttpServe,
) -> None:
    rita = embedded_http_serve.token("rita", "acme", "release", "release-manager")
    answer = propose(embedded_http_serve, rita, "deploys.trigger", {**DEPLOY, "version": "9.9.9"})
    assert answer["outcome"] == "approval_required"
    for look_alike in ("Rita", "\uff52\uff49\uff54\uff41", "r\u0456ta"):  # Cyrillic i
        other = embedded_http_serve.token(look_alike, "acme", "release-manager")
        with embedded_http_serve.client(other) as c:
            r = c.post(f"/v1/invocations/{answer['invocation_id']}/approve")
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "approver_forbidden"
        assert "look-alike" in r.json()["error"]["message"]


def test_a_refusal_before_publishing_has_the_shape_of_a_decided_one(
    embedded_http_serve: HttpServe,
) -> None:
    alice = embedded_http_serve.token("alice", "acme", "support")
    deep: dict[str, Any] = {"x": 1}
    for _ in range(12):
        deep = {"d": deep}
    answer = propose(
        embedded_http_serve, alice, "records.update", {"record_id": "REC-1", "fields": deep}
    )
    assert answer["outcome"] == answer["error"]["code"] == "invalid_arguments"
    assert answer["invocation_id"] is None
