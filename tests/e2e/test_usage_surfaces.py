"""Usage limits seen and operated through every surface, on the embedded backend (ADR 0079).

HTTP: ``POST /v1/proposals`` over a limit is 429 with ``Retry-After`` and the details;
``GET /v1/usage`` shows the session's tenant only (an operator's, every tenant); /metrics
has usage against limit. Command line: ``callgate usage``; ``callgate limits raise`` and
``reset`` need the operator role, are events with author and reason, and change what the
next call may use; ``callgate replay`` rebuilds the usage view equal to the live one. MCP:
the refused call is a tool error whose text says when to retry.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import mcp
import pytest
import yaml
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from tools.ports import free_port, wait_port

from callgate.bootstrap import Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.scope import OPERATOR_ROLE
from tests.e2e.helpers import CALLGATE, cg, cli_env
from tests.http_support import HttpServe, running
from tests.limits_support import limited_profile
from tests.mcp_support import write_profile

pytestmark = pytest.mark.e2e

TWO_TICKETS = {
    "name": "tickets-per-actor", "tools": ["tickets.create"], "max": 2, "window": "1h",
    "per": ["actor"],
}  # fmt: skip


@pytest.fixture(scope="module")
def limited_http_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServe]:
    root = tmp_path_factory.mktemp("usage-http")
    serve = HttpServe(
        root / "state", root / "serve.log", profile=limited_profile(root / "p", TWO_TICKETS),
        dev=True,
    )  # fmt: skip
    with running(serve):
        yield serve


def create(limited_http_serve: HttpServe, token: str, user: str, i: int) -> Any:
    with limited_http_serve.client(token) as c:
        body = {"tool": "tickets.create", "args": {"title": f"t{i}", "requester_id": user}}
        return c.post("/v1/proposals", json=body)


def cli(limited_http_serve: HttpServe, *args: str, rc: int = 0) -> Any:
    return cg(limited_http_serve.state_dir, *args, rc=rc, profile=limited_http_serve.profile)


def test_http_429_retry_after_usage_metrics_and_operator_changes(
    limited_http_serve: HttpServe,
) -> None:
    alice = limited_http_serve.token("alice", "acme", "support")
    gina = limited_http_serve.token("gina", "globex", "support")
    ops = limited_http_serve.token("olga", "ops", OPERATOR_ROLE)
    assert [create(limited_http_serve, alice, "alice", i).status_code for i in range(2)] == [
        200,
        200,
    ]
    assert create(limited_http_serve, gina, "gina", 0).status_code == 200
    refused = create(limited_http_serve, alice, "alice", 2)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "limit_exceeded"
    assert error["details"] | {"retry_after_s": 0} == {
        "limit": "tickets-per-actor", "window": "1h", "used": 2, "max": 2, "amount": 1,
        "retry_after_s": 0,
    }  # fmt: skip
    retry = int(refused.headers["Retry-After"])
    assert retry == error["details"]["retry_after_s"] and 3_600 <= retry <= 3_661
    print(f"\n429 Retry-After: {retry} s; message: {error['message']}")

    with limited_http_serve.client(alice) as c:  # the session's tenant only
        [mine] = c.get("/v1/usage").json()
    assert mine["scope"] == {"tenant": "acme", "actor": "alice"}
    assert (mine["used"], mine["max"], mine["held"]) == (2, 2, 0)
    with limited_http_serve.client(ops) as c:  # an operator sees every tenant
        rows = c.get("/v1/usage").json()
        metrics = c.get("/metrics").text
    assert sorted(r["scope"]["tenant"] for r in rows) == ["acme", "globex"]
    with limited_http_serve.client(
        ops
    ) as c:  # what a call of a tool by an actor counts in (the console)
        gina_tickets = c.get("/v1/usage", params={"actor": "gina", "tool": "tickets.create"})
        other_tool = c.get("/v1/usage", params={"actor": "gina", "tool": "refunds.issue"})
        exact = c.get("/v1/usage", params={"actor": "Gina", "tool": "tickets.create"})
    assert [r["scope"] for r in gina_tickets.json()] == [{"tenant": "globex", "actor": "gina"}]
    assert other_tool.json() == [] and exact.json() == []
    assert 'callgate_limit_scopes_at_limit{limit="tickets-per-actor"} 1.0' in metrics
    assert 'callgate_limit_usage_ratio{limit="tickets-per-actor"} 1.0' in metrics

    scope = ("--tenant", "acme", "--actor", "alice")
    denied = cli(limited_http_serve, "limits", "raise", "tickets-per-actor", *scope, "--by", "1",
                 "--reason", "x", "--session", alice, rc=1)  # fmt: skip
    assert denied["error"]["code"] == "operator_required"
    raised = cli(limited_http_serve, "limits", "raise", "tickets-per-actor", *scope, "--by", "1",
                 "--reason", "launch day", "--session", ops)  # fmt: skip
    assert (raised["author"], raised["reason"], raised["raise_by"]) == ("olga", "launch day", 1)
    assert create(limited_http_serve, alice, "alice", 3).status_code == 200  # 3 of 3
    assert create(limited_http_serve, alice, "alice", 4).status_code == 429
    cli(limited_http_serve, "limits", "reset", "tickets-per-actor", *scope,
        "--reason", "new quarter", "--session", ops)  # fmt: skip
    [row] = cli(limited_http_serve, "usage", "--limit", "tickets-per-actor", "--session", alice)[
        "usage"
    ]
    assert (row["used"], row["max"], row["raised"]) == (0, 2, 0)
    assert [(c["action"], c["author"], c["reason"]) for c in row["changes"]] == [
        ("raise", "olga", "launch day"), ("reset", "olga", "new quarter"),
    ]  # fmt: skip
    assert create(limited_http_serve, alice, "alice", 5).status_code == 200

    app = bootstrap(
        Settings(
            state_dir=limited_http_serve.state_dir, profile=limited_http_serve.profile, dev=True
        )
    )
    gate = app.gateway()
    try:  # the changes are on the log, as the operator made them
        changes = [
            e for e in gate.backend.read_events(ev.UsageLimitChanged)
            if isinstance(e, ev.UsageLimitChanged)
        ]  # fmt: skip
    finally:
        gate.close()
    assert [(e.action, e.author, e.tenant, e.reason) for e in changes] == [
        ("raise", "olga", "ops", "launch day"), ("reset", "olga", "ops", "new quarter"),
    ]  # fmt: skip
    replayed = cli(limited_http_serve, "replay")
    assert replayed["views"]["usage"]["equal"] is True and replayed["views"]["usage"]["live"] == 2


def test_a_limit_change_names_the_scope_the_limit_counts(limited_http_serve: HttpServe) -> None:
    ops = limited_http_serve.token("olga", "ops", OPERATOR_ROLE)
    wrong = cli(limited_http_serve, "limits", "reset", "tickets-per-actor", "--tenant", "acme",
                "--reason", "x", "--session", ops, rc=1)  # fmt: skip
    assert wrong["error"]["code"] == "invalid_request"
    assert "per actor, tenant" in wrong["error"]["message"]
    unknown = cli(limited_http_serve, "limits", "reset", "nope", "--tenant", "acme",
                  "--reason", "x", "--session", ops, rc=1)  # fmt: skip
    assert unknown["error"]["code"] == "invalid_request"


# --- MCP ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def mcp_client(url: str, token: str) -> AsyncIterator[mcp.Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, mcp.Client(streamable_http_client(url, http_client=http), cache=None) as c:
        yield c


@pytest.mark.anyio
async def test_mcp_tool_error_says_when_to_retry(tmp_path: Path) -> None:
    ledger = tmp_path / "notes.jsonl"
    ledger.write_text(json.dumps({"note_id": "N-1", "text": "x", "tool": "write_note"}) + "\n")
    profile = write_profile(tmp_path / "profile", ledger)
    doc = yaml.safe_load(profile.read_text())
    doc["limits"] = [{"name": "reads", "tools": ["notes.read"], "max": 1, "window": "1m",
                      "per": ["actor"]}]  # fmt: skip
    profile.write_text(yaml.safe_dump(doc, sort_keys=False))
    state = tmp_path / "state"
    app = bootstrap(Settings(state_dir=state, profile=profile, dev=True))
    token = app.session_issuer.issue("alice", "acme", ["support"], app.clock())
    port = free_port()
    log = (tmp_path / "mcp.log").open("w")
    argv = [str(CALLGATE), "--state-dir", str(state), "--profile", str(profile), "mcp",
            "--http", f"127.0.0.1:{port}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            env={**cli_env(), "CALLGATE_DEV": "1"})  # fmt: skip
    try:
        wait_port(port, proc, tmp_path / "mcp.log", 30)
        async with mcp_client(f"http://127.0.0.1:{port}/mcp", token) as c:
            first = await c.call_tool("notes.read", {"note_id": "N-1"})
            assert not first.is_error, first
            second = await c.call_tool("notes.read", {"note_id": "N-1"})
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
    assert second.is_error
    text = " ".join(getattr(part, "text", "") for part in second.content)
    print(f"\nMCP tool error: {text}")
    assert "limit_exceeded" in text and "limit reads exceeded" in text
    assert "retry in" in text and " s" in text
    structured = second.structured_content or {}
    assert isinstance(structured.get("retry_after_s"), int) and structured["retry_after_s"] >= 1
