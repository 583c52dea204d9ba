"""ARAP, the AuthZEN Access Request and Approval Profile, end to end (ADR 0090).

Against a real ``callgate serve --http`` (embedded backend, the bundled profile): a PEP
(``callgate-pep``) evaluates a production deploy for Rita (a release engineer), which
needs two distinct release managers: a requestable denial. The PEP submits the access
request with a callback to a real HTTP server registered as a webhook for
``access_request.decided``; the request is a callgate approval with the tool's
approvers, quorum and dry-run. Mona and Max approve over the HTTP approvals API (the
console's approval is the browser tier's); the task is approved, the signed callback is
delivered, and the re-evaluation presenting the approval is permitted, once, for exactly
that call. A denied request stays denied. Subjects are never taken on the PEP's word.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from tests.http.test_notify import Recorder, secret
from tests.http_support import HttpServe, wait_until

TENANT = "acme"
TOOL = "deploys.trigger"


class Setup:
    def __init__(self, root: Path) -> None:
        self.hook = Recorder(200)
        self.hook_secret = secret()
        self.endpoint = f"{self.hook.url}/arap"
        config = root / "callgate.toml"
        config.write_text(
            "[notify]\n"
            "retry_delays_s = [0.2, 0.4]\n"
            "timeout_s = 2\n"
            "[[notify.webhooks]]\n"
            f'url = "{self.endpoint}"\n'
            f'secret = "{self.hook_secret}"\n'
            'events = ["access_request.decided"]\n'
            f'tenants = ["{TENANT}"]\n'
        )
        env = {"CALLGATE_CONFIG": str(config)}
        self.serve = HttpServe(root / "state", root / "serve.log", env=env, dev=True)
        try:
            self.serve.wait_ready(timeout_s=120)
        except BaseException:
            self.stop()
            raise
        self.rita = self.serve.token("rita", TENANT, "release")
        self.mona = self.serve.token("mona", TENANT, "release-manager")
        self.max = self.serve.token("max", TENANT, "release-manager")
        self.pep = self.serve.client(self.serve.token("deploy-gw", TENANT, "callgate-pep"))

    def stop(self) -> None:
        try:
            if hasattr(self, "pep"):
                self.pep.close()
            assert self.serve.stop() == 0, self.serve.log.read_text()
            assert "Traceback" not in self.serve.log.read_text(), self.serve.log.read_text()
        finally:
            self.hook.stop()


@pytest.fixture(scope="module")
def arap_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    setup = Setup(tmp_path_factory.mktemp("arap"))
    try:
        yield setup
    finally:
        setup.stop()


def asked(arap_setup: Setup, version: str, **context: Any) -> dict[str, Any]:
    """The PEP's evaluation of Rita's production deploy of ``version``."""
    return {
        "subject": {"type": "user", "id": "rita", "properties": {"token": arap_setup.rita}},
        "action": {"name": TOOL},
        "resource": {"type": "service", "id": "billing"},
        "context": {"version": version, "environment": "production", **context},
    }


def evaluate(arap_setup: Setup, body: dict[str, Any]) -> dict[str, Any]:
    r = arap_setup.pep.post("/access/v1/evaluation", json=body)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def requestable(arap_setup: Setup, version: str) -> dict[str, Any]:
    denied = evaluate(arap_setup, asked(arap_setup, version))
    assert denied["decision"] is False, denied
    context: dict[str, Any] = denied["context"]
    assert context["reason"] == "approval_required" and context["outcome"] == "approval_required"
    assert context["access_request"]["endpoint"] == f"{arap_setup.serve.url}/access/v1/requests"
    assert context["evaluation_id"] == context["invocation_id"]
    return context


def submission(
    arap_setup: Setup, version: str, context: dict[str, Any], state: str
) -> dict[str, Any]:
    body = asked(arap_setup, version)
    body["denial"] = {
        "evaluation_id": context["evaluation_id"],
        "evaluated_at": context["evaluated_at"],
        "expires_at": context["access_request"]["expires_at"],
        "reason": context["reason"],
    }
    body["callback"] = {"endpoint": arap_setup.endpoint, "state": state}
    body["client"] = {"id": "deploy-gw", "actor": {"id": "agent-7", "type": "ai_agent"}}
    return body


def submit(arap_setup: Setup, version: str, state: str) -> str:
    context = requestable(arap_setup, version)
    r = arap_setup.pep.post(
        "/access/v1/requests", json=submission(arap_setup, version, context, state)
    )
    assert r.status_code == 202, r.text
    task = r.json()["task"]
    assert task["status"] == "pending" and task["id"].startswith("arq-")
    assert r.headers["Location"] == task["status_endpoint"]
    assert task["status_endpoint"] == f"{arap_setup.serve.url}/access/v1/requests/{task['id']}"
    task_id: str = task["id"]
    return task_id


def task_of(arap_setup: Setup, task_id: str) -> dict[str, Any]:
    r = arap_setup.pep.get(f"/access/v1/requests/{task_id}")
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def pending_item(arap_setup: Setup, task_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def listed() -> bool:
        with arap_setup.serve.client(arap_setup.mona) as c:
            found[:] = [p for p in c.get("/v1/pending").json() if p["invocation_id"] == task_id]
        return bool(found)

    wait_until(listed, 60, f"the pending approval of {task_id}")
    return found[0]


def decide(arap_setup: Setup, token: str, task_id: str, verb: str) -> dict[str, Any]:
    with arap_setup.serve.client(token) as c:
        r = c.post(f"/v1/invocations/{task_id}/{verb}", json={"reason": "not this week"})
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def callback_of(arap_setup: Setup, task_id: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The callback for ``task_id``, its Standard Webhooks signature verified."""
    found: list[dict[str, Any]] = []

    def delivered() -> bool:
        found[:] = [r for r in arap_setup.hook.seen() if task_id.encode() in r["body"]]
        return bool(found)

    wait_until(delivered, 30, f"the callback of {task_id}")
    assert len(found) == 1, found
    Webhook(arap_setup.hook_secret).verify(found[0]["body"], found[0]["headers"])
    assert found[0]["path"] == "/arap"
    return found[0]["headers"], json.loads(found[0]["body"])


def audit_of(arap_setup: Setup, invocation_id: str) -> dict[str, Any]:
    with arap_setup.serve.client(
        arap_setup.serve.token("auditor", TENANT, "callgate-operator")
    ) as c:
        records = c.get("/v1/audit", params={"invocation": invocation_id}).json()
    assert records, invocation_id
    record: dict[str, Any] = records[-1]
    return record


def test_metadata_announces_the_access_request_endpoint(arap_setup: Setup) -> None:
    document = httpx.get(f"{arap_setup.serve.url}/.well-known/authzen-configuration").json()
    assert document["access_request_endpoint"] == f"{arap_setup.serve.url}/access/v1/requests"
    assert document["capabilities"] == ["urn:openid:authzen:capability:access-request"]


def test_approved_by_a_quorum_then_the_re_evaluation_permits_once(arap_setup: Setup) -> None:
    version = f"3.1.{uuid.uuid4().int % 10**6}"
    task_id = submit(arap_setup, version, state="flow-1")
    item = pending_item(arap_setup, task_id)
    # The same approval path as any call: the tool's approvers, its quorum, its dry-run.
    assert item["tool"] == TOOL and item["actor"] == "rita"
    assert item["approvals_required"] == 2 and item["approver_roles"] == ["release-manager"]
    assert item["args"]["version"] == version and item["dry_run"]
    assert task_of(arap_setup, task_id)["task"]["status"] == "pending"

    assert decide(arap_setup, arap_setup.mona, task_id, "approve") == {
        "invocation_id": task_id, "granted": 1, "required": 2,
    }  # fmt: skip
    assert task_of(arap_setup, task_id)["task"]["status"] == "pending"
    with arap_setup.serve.client(
        arap_setup.rita
    ) as c:  # the actor is no approver of her own request
        assert c.post(f"/v1/invocations/{task_id}/approve").status_code == 403
    assert decide(arap_setup, arap_setup.max, task_id, "approve")["granted"] == 2

    done = task_of(arap_setup, task_id)
    assert done["task"]["status"] == "approved"
    result = done["result"]
    assert result["mode"] == "reevaluate"
    approval = result["approval"]
    assert approval["id"].startswith("apr-") and approval["state"] and approval["approved_until"]

    headers, body = callback_of(arap_setup, task_id)
    assert headers["webhook-id"] == f"access_request.decided.{task_id}"
    assert body["state"] == "flow-1"
    assert body["task"] == {
        "id": task_id,
        "status": "approved",
        "status_endpoint": f"{arap_setup.serve.url}/access/v1/requests/{task_id}",
    }
    assert body["result"] == result

    # Bound to the exact call: another version is out of the approval's scope.
    other = evaluate(arap_setup, asked(arap_setup, version + "-x", approval=approval))
    assert other["decision"] is False
    assert other["context"]["outcome"] == "approval_mismatch"
    assert other["context"]["reason"] == "out_of_scope"
    assert other["context"]["next_action"] == "request"
    assert "access_request" in other["context"]  # a fresh requestable denial for it

    permitted = evaluate(arap_setup, asked(arap_setup, version, approval=approval))
    assert permitted == {"decision": True, "context": {"approval": {"id": approval["id"]}}}
    assert audit_of(arap_setup, task_id)["outcome"] == "approval_required"

    # One approval, one permit: presented again, it is used.
    again = evaluate(arap_setup, asked(arap_setup, version, approval=approval))
    assert again["decision"] is False
    assert again["context"]["outcome"] == "approval_consumed"
    assert again["context"]["reason"] == "approval_expired"

    # An access request's approval confirms no call run through callgate.
    with arap_setup.serve.client(arap_setup.rita) as c:
        call = c.post(
            "/v1/proposals",
            json={
                "tool": TOOL,
                "args": {"service": "billing", "version": version, "environment": "production"},
                "approval_id": approval["state"],
            },
        ).json()
    assert call["outcome"] in ("approval_mismatch", "approval_consumed"), call


def test_a_denied_request_stays_denied(arap_setup: Setup) -> None:
    version = f"3.2.{uuid.uuid4().int % 10**6}"
    task_id = submit(arap_setup, version, state="flow-2")
    pending_item(arap_setup, task_id)
    decide(arap_setup, arap_setup.mona, task_id, "deny")
    denied = task_of(arap_setup, task_id)
    assert denied["task"]["status"] == "denied" and "result" not in denied
    _, body = callback_of(arap_setup, task_id)
    assert body["task"]["status"] == "denied" and "result" not in body
    # Evaluated again, the same call is denied again (still only requestable).
    assert requestable(arap_setup, version)
    # A made-up approval does not help either.
    forged = {"id": "apr-0", "state": "eyJhbGciOiJFZERTQSJ9.eyJqdGkiOiJhcHItMCJ9.c2ln"}
    refused = evaluate(arap_setup, asked(arap_setup, version, approval=forged))
    assert refused["decision"] is False
    assert refused["context"]["reason"] == "approval_unverifiable"
    assert refused["context"]["next_action"] == "none"
    with arap_setup.serve.client(arap_setup.max) as c:  # decided: nobody approves it afterwards
        assert c.post(f"/v1/invocations/{task_id}/approve").status_code == 409


def test_the_subject_is_never_taken_on_the_callers_word(arap_setup: Setup) -> None:
    version = f"3.3.{uuid.uuid4().int % 10**6}"
    context = requestable(arap_setup, version)
    body = submission(arap_setup, version, context, state="x")
    bare = json.loads(json.dumps(body))
    del bare["subject"]["properties"]
    r = arap_setup.pep.post("/access/v1/requests", json=bare)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated", r.text
    spoofed = json.loads(json.dumps(body))
    spoofed["subject"]["properties"]["token"] = arap_setup.mona  # Mona's session, Rita's id
    r = arap_setup.pep.post("/access/v1/requests", json=spoofed)
    assert r.status_code == 403 and r.json()["error"]["code"] == "identity_spoof", r.text
    # Mona's own session for Mona's id: not the subject of that denial.
    other = json.loads(json.dumps(body))
    other["subject"] = {"type": "user", "id": "mona", "properties": {"token": arap_setup.mona}}
    r = arap_setup.pep.post("/access/v1/requests", json=other)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"] == "urn:openid:authzen:access-request:error:invalid_denial_binding"
    r = httpx.post(f"{arap_setup.serve.url}/access/v1/requests", json=body)  # no PEP
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
    with arap_setup.serve.client(arap_setup.rita) as c:  # the subject's own session is no PEP
        r = c.post("/access/v1/requests", json=body)
    assert r.status_code == 403 and r.json()["error"]["code"] == "pep_required"
    with arap_setup.serve.client(arap_setup.serve.token("gw", "globex", "callgate-pep")) as c:
        r = c.post("/access/v1/requests", json=body)
        assert r.status_code == 403 and r.json()["error"]["code"] == "pep_required"
    # The arguments are the denied evaluation's, exactly.
    changed = json.loads(json.dumps(body))
    changed["context"]["version"] = version + "-other"
    r = arap_setup.pep.post("/access/v1/requests", json=changed)
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
    assert r.json()["type"].endswith(":invalid_denial_binding")


@pytest.mark.parametrize(
    ("edit", "status", "says"),
    [
        (lambda b: b["callback"].update(endpoint="http://169.254.169.254/x"), 400, "callback"),
        (lambda b: b["callback"].update(events=["approved", "done"]), 400, "callback.events"),
        (lambda b: b["denial"].pop("evaluation_id"), 400, "invalid_denial_binding"),
        (lambda b: b["denial"].update(expires_at="soon"), 400, "RFC 3339"),
        (lambda b: b.update(items=[{}]), 400, "bulk"),
        (lambda b: b["context"].update(approval={"id": "a", "state": "b"}), 400, "approval"),
    ],
)
def test_bad_submissions_are_refused_before_anything_is_requested(
    arap_setup: Setup, edit: Any, status: int, says: str
) -> None:
    version = f"3.4.{uuid.uuid4().int % 10**6}"
    body = submission(arap_setup, version, requestable(arap_setup, version), state="x")
    edit(body)
    r = arap_setup.pep.post("/access/v1/requests", json=body)
    assert r.status_code == status and says in r.text, r.text
    with arap_setup.serve.client(arap_setup.mona) as c:
        listed = [p for p in c.get("/v1/pending").json() if p["args"].get("version") == version]
    assert listed == []


def test_not_requestable_and_unknown_tasks_are_the_profiles_problems(arap_setup: Setup) -> None:
    # Rita may not delete users at all: a denial, but no requestable one.
    forbidden = {
        "subject": {"type": "user", "id": "rita", "properties": {"token": arap_setup.rita}},
        "action": {"name": "users.delete"},
        "resource": {"type": "user_id", "id": "U-7"},
    }
    denied = evaluate(arap_setup, forbidden)
    assert denied["decision"] is False and "access_request" not in denied["context"]
    denial = {
        "evaluation_id": denied["context"]["invocation_id"],
        "expires_at": "2030-01-01T00:00Z",
    }
    body = {**forbidden, "denial": denial}
    r = arap_setup.pep.post("/access/v1/requests", json=body)
    assert r.status_code == 400 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"].endswith(":not_requestable") and r.json()["code"] == "tool_forbidden"
    r = arap_setup.pep.get("/access/v1/requests/arq-unknown.x")
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"].endswith(":unknown_task") and r.json()["code"] == "not_found"
    r = arap_setup.pep.post(
        "/access/v1/requests",
        content=b'{"subject": {"type": "user", "id": "a", "id": "b"}}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text


@pytest.mark.parametrize(
    "body",
    [
        b'{"context": {"n": NaN}}',
        b'{"context": {"s": "\\ud800"}}',
        b'{"context": {"s": "\xff"}}',
        b'{"context": ' + b"[" * 500 + b"]" * 500 + b"}",
    ],
)
def test_hostile_submission_bodies_are_refused_like_every_other_body(
    arap_setup: Setup, body: bytes
) -> None:
    r = arap_setup.pep.post(
        "/access/v1/requests", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text


def test_an_oversized_submission_is_refused(arap_setup: Setup) -> None:
    body = b'{"context": {"s": "' + b"x" * 2_000_000 + b'"}}'
    r = arap_setup.pep.post(
        "/access/v1/requests", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 413, r.text


def test_another_tenants_pep_cannot_see_a_task(arap_setup: Setup) -> None:
    task_id = submit(arap_setup, f"3.9.{uuid.uuid4().int % 10**6}", state="other-tenant")
    with arap_setup.serve.client(arap_setup.serve.token("gw", "globex", "callgate-pep")) as other:
        r = other.get(f"/access/v1/requests/{task_id}")
    assert r.status_code == 404 and r.json()["type"].endswith(":unknown_task"), r.text
    assert arap_setup.pep.get(f"/access/v1/requests/{task_id}").status_code == 200
