"""Approvals that finish (ADR 0029, 0030), end to end against a running ``serve --http``.

Shared by the embedded and the Apache Kafka suites: the agent's ``callgate propose
--wait`` runs as its own process while an approver decides (over the HTTP API here; in
the console by Playwright, or by a Slack click, in the suites that pass ``approve``); the
approved call runs without any resubmission, exactly once, and ``settled_once`` checks
what every such story ends with: one effect, ``callgate audit verify`` true and
``callgate replay`` equal.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

from tests.e2e.helpers import callgate_argv, cli_env
from tests.http_support import HttpServe, wait_until

REFUND = {"order_id": "", "amount_cents": 25000, "currency": "EUR"}
DEPLOY = {"service": "billing", "version": "", "environment": "production"}


def callgate(server: HttpServe, *args: str) -> subprocess.Popen[str]:
    """``callgate --json --state-dir D ARGS`` in the server's environment (its backend)."""
    argv = [*callgate_argv(), "--json", "--state-dir", str(server.state_dir), *args]
    env = {**cli_env(dev=True), **server.env}
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def value_of(proc: subprocess.Popen[str], timeout: float = 120) -> Any:
    out, err = proc.communicate(timeout=timeout)
    assert "Traceback" not in err, err
    return json.loads(out)


def effects_of(server: HttpServe, invocation_id: str) -> list[dict[str, Any]]:
    effects = value_of(callgate(server, "effects"))
    return [e for e in effects if e["invocation_id"] == invocation_id]


def pending_item(server: HttpServe, token: str, key: str, value: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def listed() -> bool:
        with server.client(token) as c:
            found[:] = [p for p in c.get("/v1/pending").json() if p["args"].get(key) == value]
        return bool(found)

    wait_until(listed, 60, f"the pending item with {key}={value}")
    return found[0]


def settled_once(server: HttpServe, invocation_id: str) -> None:
    """Exactly one effect at the provider for ``invocation_id``; ``callgate audit verify``
    true; ``callgate replay`` equal (the projections rebuilt from the log equal the live
    ones: eventually, on Kafka, whose views follow the log)."""
    assert len(effects_of(server, invocation_id)) == 1
    verified = value_of(callgate(server, "audit", "verify"))
    assert verified["ok"] is True and verified["records"] >= 1, verified
    deadline = time.monotonic() + 60
    while not (replayed := value_of(callgate(server, "replay")))["equal"]:
        assert time.monotonic() < deadline, replayed
        time.sleep(0.5)
    assert replayed["events"] > 0, replayed


def agent_waits(
    server: HttpServe, agent: str, order: str
) -> tuple[subprocess.Popen[str], str, str]:
    """The agent's ``callgate propose --wait 120s`` of a high-impact refund of ``order``,
    its own process: (the process, its idempotency key, the arguments' JSON)."""
    key = f"refund-{order}-{uuid.uuid4().hex[:6]}"
    args = json.dumps({**REFUND, "order_id": order})
    proc = callgate(
        server,
        *("propose", "--session", agent, "--tool", "refunds.issue", "--args", args),
        *("--idempotency-key", key, "--wait", "120s"),
    )
    return proc, key, args


def refund_waited_on_runs_once_approved(
    server: HttpServe, agent_token: str, reader: str, approve: Callable[[str], None]
) -> str:
    """The agent waits on a high-impact refund; ``approve(invocation_id)`` approves it
    however the suite does; the waiting ``propose --wait`` prints ``executed`` (no
    resubmission) and the story ends ``settled_once``. ``reader`` sees the pending list."""
    order = f"ORD-{uuid.uuid4().hex[:8]}"
    agent, _, _ = agent_waits(server, agent_token, order)
    try:
        inv: str = pending_item(server, reader, "order_id", order)["invocation_id"]
        approve(inv)
        answer = value_of(agent)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert answer["outcome"] == "executed", answer
    assert answer["invocation_id"] == inv and answer["final"] is True
    assert answer["result"]["order_id"] == order
    settled_once(server, inv)
    return inv


def refund_approved_over_http_runs_without_resubmission(server: HttpServe) -> None:
    alice = server.token("alice", "acme", "support")
    fran = server.token("fran", "acme", "finance-approver")
    order = f"ORD-{uuid.uuid4().hex[:8]}"
    agent, key, args = agent_waits(server, alice, order)
    try:
        item = pending_item(server, fran, "order_id", order)
        inv = item["invocation_id"]
        with server.client(fran) as c:
            approved = c.post(f"/v1/invocations/{inv}/approve")
            assert approved.status_code == 200, approved.text
            body = approved.json()
            assert body["invocation_id"] == inv and body["approval_id"]
            again = c.post(f"/v1/invocations/{inv}/approve")  # approving twice
            assert again.status_code == 409, again.text
            assert again.json()["error"]["code"] == "not_pending"
        answer = value_of(agent)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert answer["outcome"] == "executed", answer
    assert answer["invocation_id"] == inv and answer["final"] is True
    assert answer["result"]["order_id"] == order
    assert len(effects_of(server, inv)) == 1
    with server.client(alice) as c:
        polled = c.get(f"/v1/invocations/{inv}", params={"wait": 5}).json()
        assert polled["outcome"] == "executed" and polled["final"] is True
        assert polled["approved_by"] == {
            "approval_jti": polled["approved_by"]["approval_jti"],
            "approver": "fran",
            "approved_invocation_id": inv,
        }
        # V2: the continued call resubmitted with its key and approval replays it
        replay = c.post(
            "/v1/proposals",
            headers={"Idempotency-Key": key},
            json={
                "tool": "refunds.issue",
                "args": json.loads(args),
                "approval_id": body["approval_id"],
            },
        ).json()
        assert replay["outcome"] == "replayed", replay
        with c.stream("GET", f"/v1/invocations/{inv}/events") as stream:
            events = [
                json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")
            ]
        assert events[-1]["outcome"] == "executed" and events[-1]["final"] is True

        def audited() -> bool:
            records = c.get("/v1/audit", params={"invocation": inv}).json()
            return bool(records) and records[-1]["outcome"] == "executed"

        wait_until(audited, 60, "the audit record of the execution")
        record = c.get("/v1/audit", params={"invocation": inv}).json()[-1]
        assert record["authorized_by"]["decision"] == "permit"
        assert record["authorized_by"]["approval"]["approver"] == "fran"
        assert c.get("/v1/audit/verify").json()["ok"] is True
    settled_once(server, inv)


def deploy_needs_two_distinct_release_managers(server: HttpServe) -> None:
    rita = server.token("rita", "acme", "release", "release-manager")
    rita_again = server.token("RITA", "acme", "release-manager")  # the actor, respelled
    mona = server.token("mona", "acme", "release-manager")
    mona_again = server.token("\uff2d\uff4f\uff4e\uff41", "acme", "release-manager")  # full width
    max_ = server.token("max", "acme", "release-manager")
    version = f"2.0.{uuid.uuid4().int % 10**9}"
    with server.client(rita) as c:
        first = c.post(
            "/v1/proposals",
            params={"wait": 30},
            json={"tool": "deploys.trigger", "args": {**DEPLOY, "version": version}},
        ).json()
    assert first["outcome"] == "approval_required", first
    inv = first["invocation_id"]
    item = pending_item(server, mona, "version", version)
    assert item["approvals_required"] == 2 and item["grants"] == []
    with server.client(mona) as c:
        one = c.post(f"/v1/invocations/{inv}/approve")
        assert one.status_code == 200, one.text
        assert one.json() == {"invocation_id": inv, "granted": 1, "required": 2}
    wait_until(
        lambda: pending_item(server, mona, "version", version)["grants"] == ["mona"],
        60,
        "the first grant in the pending view",
    )
    for token in (mona, mona_again, rita_again):
        with server.client(token) as c:
            refused = c.post(f"/v1/invocations/{inv}/approve")
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "approver_forbidden"
    with server.client(rita) as c:
        status = c.get(f"/v1/invocations/{inv}", params={"wait": 1}).json()
        assert status["outcome"] == "approval_required" and status["final"] is False
        assert status["quorum"]["grants"] == ["mona"]
    assert effects_of(server, inv) == []
    with server.client(max_) as c:
        two = c.post(f"/v1/invocations/{inv}/approve")
        assert two.status_code == 200, two.text
        assert two.json()["approval_id"] and two.json()["granted"] == 2
    with server.client(rita) as c:
        done = c.get(f"/v1/invocations/{inv}", params={"wait": 60}).json()
        assert done["outcome"] == "executed" and done["final"] is True, done
    settled_once(server, inv)
