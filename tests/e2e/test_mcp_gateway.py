"""``callgate mcp`` in front of a real upstream MCP server, driven by the SDK's client.

The upstream is ``tests/mcp_upstream.py`` (the SDK's ``MCPServer``), started by callgate
itself from the profile (``providers: notes: {kind: mcp, command: [...]}``) and keeping its
effect ledger in a file. The agent side is the SDK's ``Client`` (a ``ClientSession``)
connected to the installed ``callgate mcp`` over stdio (a subprocess it spawns) and over
streamable HTTP (a ``callgate mcp --http`` subprocess), on the embedded backend. Every
test runs on both transports.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
import mcp
import mcp_types as types
import pytest
from tools.ports import free_port, wait_port

from tests.e2e.helpers import CALLGATE, cg, cli_env
from tests.mcp_support import (
    CONSOLE,
    Gate,
    MakeMcpGate,
    effects,
    inject,
    running_gate,
    upstream_command,
    write_profile,
)
from tests.mcp_upstream import JSONRPC_FAULT_CODE, JSONRPC_FAULT_DATA

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@pytest.fixture(params=["stdio", "http"])
def mcp_gate(request: pytest.FixtureRequest, make_mcp_gate: MakeMcpGate) -> Gate:
    """The notes profile's gate, over each transport."""
    return make_mcp_gate(request.param)


def body(result: types.CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


def outcome(result: types.CallToolResult) -> str:
    return str(body(result).get("outcome", "executed" if not result.is_error else "?"))


def meta(key: str | None = None, approval_id: str | None = None) -> types.RequestParamsMeta:
    """The ``_meta`` of a confirming or keyed call (the SDK types it as a TypedDict)."""
    m: dict[str, Any] = {}
    if key is not None:
        m["callgate/idempotency_key"] = key
    if approval_id is not None:
        m["callgate/approval_id"] = approval_id
    return cast(types.RequestParamsMeta, m)


ALICE_ROLES = ["support"]


async def test_tools_list_shows_only_what_the_principal_could_call(mcp_gate: Gate) -> None:
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        names = {t.name for t in (await c.list_tools()).tools}
    assert names == {"notes.read", "notes.write", "notes.quick_write", "notes.send", "notes.delete"}
    async with mcp_gate.client(mcp_gate.token("carol", ["auditor"])) as c:
        listed = (await c.list_tools()).tools
    assert {t.name for t in listed} == {"notes.read", "notes.audit"}
    read = next(t for t in listed if t.name == "notes.read")
    assert read.input_schema["required"] == ["note_id"]  # the catalog's argument schema
    assert read.annotations is not None and read.annotations.read_only_hint is True


async def test_read_executes_and_returns_the_upstream_result(mcp_gate: Gate) -> None:
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        wrote = await c.call_tool(
            "notes.quick_write", {"note_id": "N-1", "text": "hello", "author": "alice"}
        )
        assert not wrote.is_error, wrote
        read = await c.call_tool("notes.read", {"note_id": "N-1"})
    assert not read.is_error, read
    assert read.structured_content == {"note_id": "N-1", "text": "hello", "author": None}
    assert read.meta is not None and read.meta["callgate/outcome"] == "executed"
    assert [e["note_id"] for e in effects(mcp_gate.ledger)] == ["N-1"]
    # the upstream got callgate's idempotency token and the session's tenant in _meta
    (effect,) = effects(mcp_gate.ledger)
    assert effect["token"] and effect["tenant"] == "acme"
    assert wrote.meta is not None
    assert effect["invocation_id"] == wrote.meta["callgate/invocation_id"]


async def test_v1_identity_spoof_through_mcp(mcp_gate: Gate) -> None:
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        r = await c.call_tool(
            "notes.quick_write", {"note_id": "N-9", "text": "x", "author": "mallory"}
        )
    assert r.is_error and outcome(r) == "identity_spoof"
    assert body(r)["error"]["code"] == "identity_spoof" and body(r)["invocation_id"]
    assert effects(mcp_gate.ledger) == []


async def test_v2_confirmed_dry_run_swapped_arguments_and_replay(mcp_gate: Gate) -> None:
    args = {"note_id": "N-2", "text": "approved text", "author": "alice"}
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        first = await c.call_tool("notes.write", args, meta=meta("k-v2"))
        assert first.is_error and outcome(first) == "approval_required"
        pending = body(first)
        # the dry-run is the upstream's preview_note result, and where to approve is named
        assert pending["dry_run"]["structuredContent"] == {
            "note_id": "N-2",
            "before": None,
            "after": "approved text",
        }
        assert pending["approve_at"] == f"{CONSOLE}/#invocation={pending['invocation_id']}"
        assert effects(mcp_gate.ledger) == []

        approval_id = mcp_gate.approve(pending["invocation_id"])
        swapped = await c.call_tool(
            "notes.write",
            {**args, "text": "swapped text"},
            meta=meta("k-v2", approval_id),
        )
        assert swapped.is_error and outcome(swapped) == "approval_mismatch", swapped
        assert "args_hash" in json.dumps(body(swapped)["error"])  # names what differs
        done = await c.call_tool("notes.write", args, meta=meta("k-v2", approval_id))
        assert not done.is_error, done
        assert done.structured_content == {
            "note_id": "N-2",
            "text": "approved text",
            "author": "alice",
        }
        again = await c.call_tool("notes.write", args, meta=meta("k-v2"))
        assert not again.is_error, again
        assert again.meta is not None and again.meta["callgate/outcome"] == "replayed"
    assert len(effects(mcp_gate.ledger, "write_note")) == 1


async def test_timeout_after_the_effect_is_reconciled_once(mcp_gate: Gate) -> None:
    args = {"note_id": "N-3", "text": "slow", "author": "alice"}
    inject(mcp_gate.ledger, "write_note", "timeout_after_apply")
    inject(mcp_gate.ledger, "send_note", "timeout_after_apply")
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        first = await c.call_tool("notes.quick_write", args, meta=meta("k-slow"))
        assert first.is_error and outcome(first) == "outcome_uncertain", first
        retry = await c.call_tool("notes.quick_write", args, meta=meta("k-slow"))
        assert not retry.is_error, retry  # found by find_note: the first call's result
        assert retry.structured_content == args, retry  # what find_note found
        # no lookup tool: the outcome stays uncertain and is never retried blindly
        send = {"note_id": "N-3", "to": "x@example.com"}
        sent = await c.call_tool("notes.send", send, meta=meta("k-send"))
        assert outcome(sent) == "outcome_uncertain", sent
        resent = await c.call_tool("notes.send", send, meta=meta("k-send"))
        assert outcome(resent) == "outcome_uncertain", resent
    assert len(effects(mcp_gate.ledger, "write_note")) == 1
    assert len(effects(mcp_gate.ledger, "send_note")) == 1


async def test_refusals_are_coded_tool_errors(mcp_gate: Gate) -> None:
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        cases: dict[str, tuple[str, dict[str, Any]]] = {
            "dry_run_unavailable": ("notes.delete", {"note_id": "N-1"}),
            "unknown_tool": ("purge_all", {}),
            "tool_forbidden": ("notes.read", {"note_id": "GN-1"}),  # another tenant's note
            "invalid_arguments": ("notes.read", {"note_id": "N-1", "extra": 1}),
        }
        for code, (tool, args) in cases.items():
            r = await c.call_tool(tool, args)
            assert r.is_error and outcome(r) == code, (code, r)
            assert body(r)["error"]["code"] == code
            assert r.content and isinstance(r.content[0], types.TextContent)
            assert r.content[0].text.startswith(f"{code}: ")
        # the role check is the decider's too: a tool the session may not call
        denied = await c.call_tool("notes.audit", {"note_id": "N-1"})
        assert outcome(denied) == "tool_forbidden"
    assert effects(mcp_gate.ledger) == []


async def test_hostile_inputs_get_coded_errors(mcp_gate: Gate) -> None:
    deep: Any = "x"
    for _ in range(60):
        deep = {"d": deep}
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        hostile: dict[str, dict[str, Any]] = {
            "oversized": {"note_id": "N-1", "text": "x" * 20_000, "author": "alice"},
            "deeply nested": {"note_id": "N-1", "text": deep, "author": "alice"},
            "non-finite": {"note_id": "N-1", "text": float("nan"), "author": "alice"},
            "other tenant": {"note_id": "GN-7", "text": "x", "author": "alice"},
            "other tenant field": {"note_id": "N-1", "text": "x", "tenant": "globex"},
        }
        for what, args in hostile.items():
            r = await c.call_tool("notes.quick_write", args)
            assert r.is_error, (what, r)
            assert outcome(r) in {"invalid_arguments", "tool_forbidden", "identity_spoof"}, (
                what,
                r,
            )
        bad_meta = await c.call_tool(
            "notes.read",
            {"note_id": "N-1"},
            meta=cast(types.RequestParamsMeta, {"callgate/idempotency_key": 7}),
        )
        assert outcome(bad_meta) == "invalid_arguments"
    assert effects(mcp_gate.ledger) == []


async def test_approval_required_asks_through_url_elicitation(mcp_gate: Gate) -> None:
    asked: list[types.ElicitRequestURLParams] = []

    async def on_elicit(
        context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        assert isinstance(params, types.ElicitRequestURLParams)
        asked.append(params)
        return types.ElicitResult(action="accept")

    token = mcp_gate.token("alice", ALICE_ROLES)
    async with mcp_gate.client(token, mode="legacy", elicitation_callback=on_elicit) as c:
        r = await c.call_tool("notes.write", {"note_id": "N-4", "text": "t", "author": "alice"})
    assert outcome(r) == "approval_required"
    (params,) = asked
    assert params.url == f"{CONSOLE}/#invocation={body(r)['invocation_id']}"
    assert body(r)["elicitation"] == "accept"
    assert effects(mcp_gate.ledger) == []  # accepting opens the console; it approves nothing


@pytest.mark.parametrize("mcp_gate", ["http"], indirect=True)
def test_http_requires_a_bearer_token(mcp_gate: Gate) -> None:
    assert mcp_gate.url is not None
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    r = httpx.post(
        mcp_gate.url, json=ping, headers={"Accept": "application/json, text/event-stream"}
    )
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
    # a raw NaN literal is not JSON: the MCP server answers a JSON-RPC parse error
    raw = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call"})[:-1]
    raw += ', "params": {"name": "notes.read", "arguments": {"note_id": NaN}}}'
    r = httpx.post(
        mcp_gate.url,
        content=raw,
        headers={
            "Authorization": f"Bearer {mcp_gate.token('alice', ALICE_ROLES)}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25",
        },
    )
    assert r.status_code in (400, 200), r.text
    assert "error" in r.text


@pytest.mark.parametrize("mcp_gate", ["stdio"], indirect=True)
async def test_upstream_failure_is_execution_failed(mcp_gate: Gate) -> None:
    inject(mcp_gate.ledger, "write_note", "fail")
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        r = await c.call_tool("notes.quick_write", {"note_id": "N-5", "text": "t"})
    assert outcome(r) == "execution_failed", r
    assert "upstream reported an error" in body(r)["error"]["message"]
    assert effects(mcp_gate.ledger) == []


async def test_an_upstream_jsonrpc_error_reaches_the_agent_as_that_error(mcp_gate: Gate) -> None:
    """An upstream's JSON-RPC error is the agent's JSON-RPC error (code, message, data),
    not a tool result; nothing ran, and the status and the audit keep the code."""
    from callgate.domain.scope import OPERATOR_ROLE

    inject(mcp_gate.ledger, "write_note", "jsonrpc_error")
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        with pytest.raises(mcp.MCPError) as refused:
            await c.call_tool("notes.quick_write", {"note_id": "N-6", "text": "t"})
        assert refused.value.code == JSONRPC_FAULT_CODE
        assert refused.value.message == "write_note refused (injected)"
        assert refused.value.data == JSONRPC_FAULT_DATA
        again = await c.call_tool("notes.quick_write", {"note_id": "N-6", "text": "t"})
        assert not again.is_error, again  # the fault was one call's; the session goes on
    assert [e["note_id"] for e in effects(mcp_gate.ledger)] == ["N-6"]
    operator = mcp_gate.token("olga", [OPERATOR_ROLE], tenant="ops")
    records = cg(mcp_gate.state_dir, "audit", "--session", operator, profile=mcp_gate.profile)
    [failed] = [r for r in records if r["outcome"] == "execution_failed"]
    assert failed["upstream_code"] == JSONRPC_FAULT_CODE
    status = cg(mcp_gate.state_dir, "status", failed["invocation_id"], "--session", operator,
                profile=mcp_gate.profile)  # fmt: skip
    assert status["error"]["details"]["upstream_error"] == {
        "code": JSONRPC_FAULT_CODE,
        "message": "write_note refused (injected)",
        "data": JSONRPC_FAULT_DATA,
    }
    assert cg(mcp_gate.state_dir, "audit", "verify", profile=mcp_gate.profile)["ok"] is True


async def test_upstream_over_streamable_http(tmp_path: Path) -> None:
    """The provider reaches an upstream by URL as well as by command."""
    ledger = tmp_path / "notes.jsonl"
    port = free_port()
    upstream = subprocess.Popen(
        [*upstream_command(ledger), "--http", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, upstream, None, 30)
        url = f"http://127.0.0.1:{port}/mcp"
        g = Gate(
            tmp_path / "state", write_profile(tmp_path / "p", ledger, url=url), ledger, "stdio"
        )
        g.state_dir.mkdir()
        inject(ledger, "write_note", "timeout_after_apply")
        args = {"note_id": "N-6", "text": "by url", "author": "alice"}
        async with g.client(g.token("alice", ALICE_ROLES)) as c:
            first = await c.call_tool("notes.quick_write", args, meta=meta("k-url"))
            assert outcome(first) == "outcome_uncertain", first
            retry = await c.call_tool("notes.quick_write", args, meta=meta("k-url"))
            assert not retry.is_error and retry.structured_content == args, retry
            read = await c.call_tool("notes.read", {"note_id": "N-6"})
            assert not read.is_error and body(read)["text"] == "by url"
        assert len(effects(ledger, "write_note")) == 1
    finally:
        upstream.terminate()
        upstream.wait(timeout=20)


@pytest.mark.parametrize("mcp_gate", ["http"], indirect=True)
async def test_an_invalid_bearer_token_is_unauthenticated(mcp_gate: Gate) -> None:
    forged = mcp_gate.token("alice", ALICE_ROLES)[:-6] + "AAAAAA"
    async with mcp_gate.client(forged) as c:
        with pytest.raises(mcp.MCPError, match="unauthenticated"):
            await c.list_tools()
        r = await c.call_tool("notes.read", {"note_id": "N-1"})
    assert outcome(r) == "unauthenticated", r  # decided by the decider, like any proposal


# --- one strict reader, exact identifiers (issue 25) ----------------------------------------


@pytest.fixture(scope="module", params=["stdio", "http"])
def secret_note_gate(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gate]:
    """A gate per transport holding alice's note N-1 ("secret"), shared by the module's
    spellings: each only reads (and is refused), so none changes what another sees, and the
    gate and the note are made once instead of once per spelling."""

    async def write_secret(gate: Gate) -> None:
        async with gate.client(gate.token("alice", ALICE_ROLES)) as c:
            wrote = await c.call_tool(
                "notes.quick_write", {"note_id": "N-1", "text": "secret", "author": "alice"}
            )
        assert not wrote.is_error, wrote

    folder = tmp_path_factory.mktemp(f"secret-{request.param}")
    with running_gate(folder, request.param) as gate:
        anyio.run(write_secret, gate)
        yield gate


FULLWIDTH_ACME = "\uff41\uff43\uff4d\uff45"


@pytest.mark.parametrize(
    ("tenant", "roles", "code"),
    [
        ("ACME", ["support"], "tool_forbidden"),
        ("Acme", ["support"], "tool_forbidden"),
        ("acme ", ["support"], "unauthenticated"),
        (FULLWIDTH_ACME, ["support"], "tool_forbidden"),
        ("acme", ["SUPPORT"], "tool_forbidden"),
        ("acme", ["Support"], "tool_forbidden"),
        ("acme", [" support"], "unauthenticated"),
    ],
)
async def test_other_spellings_of_tenant_and_role_get_nothing(
    secret_note_gate: Gate, tenant: str, roles: list[str], code: str
) -> None:
    """N-* notes are acme's and notes.read is support's: another spelling is another
    identifier (exact to grant), or not canonical (unauthenticated); never access."""
    async with secret_note_gate.client(secret_note_gate.token("ivan", roles, tenant)) as c:
        r = await c.call_tool("notes.read", {"note_id": "N-1"})
    assert r.is_error and outcome(r) == code, r
    assert "secret" not in json.dumps(body(r))


def _raw_call(arguments_json: str, request_id: int = 7) -> str:
    return (
        '{"jsonrpc": "2.0", "id": ' + str(request_id) + ', "method": "tools/call", '
        '"params": {"name": "notes.read", "arguments": ' + arguments_json + "}}"
    )


DUPLICATES = {
    "in arguments": _raw_call('{"note_id": "GN-1", "note_id": "N-1"}'),
    "in the envelope": (
        '{"jsonrpc": "2.0", "id": 7, "method": "tools/list", "method": "tools/call", '
        '"params": {"name": "notes.read", "arguments": {"note_id": "N-1"}}}'
    ),
    "escaped key": _raw_call('{"note_id": "GN-1", "note\\u005fid": "N-1"}'),
    "in a resource URI": (
        '{"jsonrpc": "2.0", "id": 7, "method": "resources/read", '
        '"params": {"uri": "notes://GN-readme", "uri": "notes://N-readme"}}'
    ),
    "in prompt arguments": (
        '{"jsonrpc": "2.0", "id": 7, "method": "prompts/get", "params": '
        '{"name": "notes.summarize", "arguments": {"note_id": "GN-1", "note_id": "N-1"}}}'
    ),
}


@pytest.fixture(scope="module")
def http_refusing_gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    """One ``callgate mcp --http`` for the duplicate-key cases: each is refused before
    anything runs (each checks the ledger stays empty), so they share it."""
    with running_gate(tmp_path_factory.mktemp("duplicates"), "http") as gate:
        yield gate


@pytest.mark.parametrize("where", sorted(DUPLICATES))
def test_duplicate_keys_over_http_are_a_json_rpc_parse_error(
    http_refusing_gate: Gate, where: str
) -> None:
    mcp_gate = http_refusing_gate
    assert mcp_gate.url is not None
    r = httpx.post(
        mcp_gate.url,
        content=DUPLICATES[where],
        headers={
            "Authorization": f"Bearer {mcp_gate.token('alice', ALICE_ROLES)}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25",
        },
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert r.json()["id"] == 7 and error["code"] == -32700
    assert error["data"]["code"] == "invalid_request" and "duplicate key" in error["message"]
    assert effects(mcp_gate.ledger) == []


@pytest.mark.parametrize("mcp_gate", ["stdio"], indirect=True)
def test_duplicate_keys_over_stdio_are_a_json_rpc_parse_error(mcp_gate: Gate) -> None:
    """Raw lines to ``callgate mcp``: each refused line gets its JSON-RPC error (by id) and
    the server goes on answering well-formed requests."""
    init = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}},
    }  # fmt: skip
    lines = [json.dumps(init), '{"jsonrpc": "2.0", "method": "notifications/initialized"}']
    lines += [
        text.replace('"id": 7', f'"id": {10 + i}') for i, text in enumerate(DUPLICATES.values())
    ]
    lines.append(json.dumps({"jsonrpc": "2.0", "id": 99, "method": "tools/list", "params": {}}))
    proc = subprocess.Popen(
        [str(CALLGATE), "--state-dir", str(mcp_gate.state_dir), "--profile", str(mcp_gate.profile),
         "mcp", "--session", mcp_gate.token("alice", ALICE_ROLES)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**cli_env(), "CALLGATE_DEV": "1"},
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    answers: dict[Any, Any] = {}
    try:
        proc.stdin.write("\n".join(lines) + "\n")
        proc.stdin.flush()
        expected = {99, *range(10, 10 + len(DUPLICATES))}
        while not expected <= set(answers):  # it goes on after refused lines
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "no answer"
            answer = json.loads(line)
            answers[answer.get("id")] = answer
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    for i in range(len(DUPLICATES)):
        error = answers[10 + i]["error"]
        assert error["code"] == -32700 and error["data"]["code"] == "invalid_request", error
        assert "duplicate key" in error["message"]
    assert "tools" in answers[99]["result"], answers
    assert effects(mcp_gate.ledger) == []


@pytest.mark.parametrize("mcp_gate", ["stdio"], indirect=True)
async def test_an_approver_under_a_look_alike_of_the_actor_is_refused(mcp_gate: Gate) -> None:
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        r = await c.call_tool("notes.write", {"note_id": "N-3", "text": "t", "author": "alice"})
    assert outcome(r) == "approval_required", r
    inv = str(body(r)["invocation_id"])
    for look_alike in ("Alice", "\uff41lice", "\u0430lice"):  # full width a, Cyrillic a
        approver = mcp_gate.token(look_alike, ["notes-approver"])
        refused = cg(mcp_gate.state_dir, "approve", inv, "--session", approver, rc=1)
        assert refused["error"]["code"] == "approver_forbidden", refused
        assert "look-alike" in refused["error"]["message"]
    assert effects(mcp_gate.ledger) == []


@contextlib.asynccontextmanager
async def held_client(g: Gate, token: str, hold_s: float) -> AsyncIterator[mcp.Client]:
    """The SDK's client over stdio to ``callgate mcp --hold SECONDS`` (ADR 0029)."""
    params = mcp.StdioServerParameters(
        command=str(CALLGATE),
        args=[
            *("--state-dir", str(g.state_dir), "--profile", str(g.profile)),
            *("mcp", "--session", token, "--console-url", CONSOLE, "--hold", str(hold_s)),
        ],
        env={**cli_env(), "CALLGATE_DEV": "1"},
    )
    async with mcp.Client(params, cache=None) as client:
        yield client


def approve_when_pending(g: Gate, note_id: str, decision: str = "approve") -> str:
    """The approver, in another process: waits for the item, then decides on it."""
    bob = g.token("bob", ["notes-approver"])
    deadline = time.monotonic() + 60
    while True:
        items = cg(g.state_dir, "pending", "--session", bob, profile=g.profile)
        found = [p for p in items if p["args"].get("note_id") == note_id]
        if found:
            break
        assert time.monotonic() < deadline, "the held call never became pending"
        time.sleep(0.3)
    inv = str(found[0]["invocation_id"])
    cg(g.state_dir, decision, inv, "--session", bob, profile=g.profile)
    return inv


async def test_a_held_call_answers_with_the_executed_result_once_approved(
    tmp_path: Path,
) -> None:
    """ADR 0029: the high-impact tools/call stays open while its approval is pending, with
    progress notifications, and returns the upstream's result once approved: one effect,
    no resubmission. Calling again with the same arguments resumes it (no second call)."""
    import anyio

    ledger = tmp_path / "notes.jsonl"
    g = Gate(tmp_path / "state", write_profile(tmp_path / "profile", ledger), ledger, "stdio")
    g.state_dir.mkdir()
    args = {"note_id": "N-held", "text": "held text", "author": "alice"}
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with held_client(g, g.token("alice", ALICE_ROLES), 60) as c:
        async with anyio.create_task_group() as tg:
            approved: list[str] = []

            async def approver() -> None:
                await anyio.sleep(2.5)  # some progress first
                approved.append(await anyio.to_thread.run_sync(approve_when_pending, g, "N-held"))

            tg.start_soon(approver)
            result = await c.call_tool("notes.write", args, progress_callback=on_progress)
        assert not result.is_error, result
        assert result.structured_content == args | {"text": "held text"}
        assert result.meta is not None
        assert result.meta["callgate/invocation_id"] == approved[0]
        assert result.meta["callgate/outcome"] == "executed"
        assert seen, "no progress notification while held"
        # the same call again from the same principal: its result, not a second effect
        again = await c.call_tool("notes.write", args)
        assert not again.is_error, again
        assert again.meta is not None and again.meta["callgate/invocation_id"] == approved[0]
    assert len(effects(ledger, "write_note")) == 1


async def test_a_held_call_answers_approval_denied(tmp_path: Path) -> None:
    import anyio

    ledger = tmp_path / "notes.jsonl"
    g = Gate(tmp_path / "state", write_profile(tmp_path / "profile", ledger), ledger, "stdio")
    g.state_dir.mkdir()
    args = {"note_id": "N-deny", "text": "no", "author": "alice"}
    async with (
        held_client(g, g.token("alice", ALICE_ROLES), 60) as c,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(anyio.to_thread.run_sync, approve_when_pending, g, "N-deny", "deny")
        result = await c.call_tool("notes.write", args)
    assert result.is_error and outcome(result) == "approval_denied", result
    assert effects(ledger) == []


# -- resources and prompts under policy (ADR 0044) ---------------------------------------


def reads(ledger: Path) -> list[str]:
    """What the upstream served: one ledger line per resource read or prompt."""
    return [
        str(e["note_id"]) for e in effects(ledger) if e["tool"] in ("resources/read", "prompts/get")
    ]


async def refused(call: Any) -> dict[str, Any]:
    """The coded JSON-RPC refusal of a non-tool request."""
    with pytest.raises(mcp.MCPError) as err:
        await call
    assert err.value.code == types.INVALID_PARAMS, err.value
    data = err.value.data
    assert isinstance(data, dict) and err.value.message.startswith(f"{data['code']}: ")
    return data


async def test_resources_are_read_after_the_acl_and_lists_are_filtered(mcp_gate: Gate) -> None:
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        listed = {str(r.uri) for r in (await c.list_resources()).resources}
        assert listed == {"notes://N-readme"}  # not globex's, not the uncatalogued secret
        templates = (await c.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["notes://{note_id}"]
        read = await c.read_resource("notes://N-readme")
        assert [getattr(x, "text", None) for x in read.contents] == ["acme readme"]
        assert read.meta is not None and read.meta["callgate/outcome"] == "executed"
        invocation = str(read.meta["callgate/invocation_id"])
        # another tenant's resource, an uncatalogued one, an oversized URI: coded, unread
        other = await refused(c.read_resource("notes://GN-readme"))
        assert other["code"] == "tool_forbidden" and other["invocation_id"]
        assert (await refused(c.read_resource("secret://keys")))["code"] == "unknown_tool"
        long_uri = "notes://N-" + "x" * 5000
        assert (await refused(c.read_resource(long_uri)))["code"] == "invalid_arguments"
        # a resource entry is not a tool
        as_tool = await c.call_tool("notes.resource", {"uri": "notes://N-readme"})
        assert as_tool.is_error and outcome(as_tool) == "unknown_tool"
    assert reads(mcp_gate.ledger) == ["N-readme"]
    # the read's decision is recorded like a call's
    status = cg(
        mcp_gate.state_dir, "status", invocation, "--session", mcp_gate.token("alice", ALICE_ROLES)
    )
    assert status["outcome"] == "executed"
    async with mcp_gate.client(mcp_gate.token("carol", ["auditor"])) as c:
        assert (await c.list_resources()).resources == []  # no role for the entry
        assert (await refused(c.read_resource("notes://N-readme")))["code"] == "tool_forbidden"
    assert reads(mcp_gate.ledger) == ["N-readme"]


async def test_prompts_are_decided_like_calls(mcp_gate: Gate) -> None:
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        assert [p.name for p in (await c.list_prompts()).prompts] == ["notes.summarize"]
        got = await c.get_prompt("notes.summarize", {"note_id": "N-1", "style": "long"})
        assert "Summarize note N-1 (long)." in json.dumps(got.model_dump(mode="json"))
        hostile: dict[str, dict[str, str]] = {
            "invalid_arguments": {"note_id": "N-1", "style": "x" * 10_000},
            "tool_forbidden": {"note_id": "GN-1"},  # another tenant's note
        }
        for code, args in hostile.items():
            assert (await refused(c.get_prompt("notes.summarize", args)))["code"] == code
        assert (await refused(c.get_prompt("leak_everything")))["code"] == "unknown_tool"
        assert (await refused(c.get_prompt("summarize_note", {"note_id": "N-1"})))[
            "code"
        ] == "unknown_tool"  # the upstream's own name is not an entry
    assert reads(mcp_gate.ledger) == ["N-1"]


async def test_the_documented_stdio_host_configuration_works(tmp_path: Path) -> None:
    """The stdio ``mcpServers`` entry of docs/how-to/integrations.md, as a host would run
    it: the session comes from ``env``, not from the arguments."""
    import re

    from tests.e2e.helpers import REPO

    doc = (REPO / "docs" / "how-to" / "integrations.md").read_text()
    section = doc.split("## 5. What an MCP host's configuration must contain", 1)[1]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None
    (entry,) = json.loads(block.group(1))["mcpServers"].values()
    ledger = tmp_path / "notes.jsonl"
    g = Gate(tmp_path / "state", write_profile(tmp_path / "profile", ledger), ledger, "stdio")
    g.state_dir.mkdir()
    assert entry["command"] == "callgate" and "CALLGATE_SESSION" in entry["env"]
    args = [str(g.profile) if a == "/etc/callgate/profile.yaml" else a for a in entry["args"]]
    params = mcp.StdioServerParameters(
        command=str(CALLGATE),
        args=["--state-dir", str(g.state_dir), *args],
        env={
            **cli_env(),
            "CALLGATE_DEV": "1",  # development tokens
            "CALLGATE_SESSION": g.token("alice", ALICE_ROLES),
        },
    )
    async with mcp.Client(params, cache=None) as c:
        assert "notes.read" in {t.name for t in (await c.list_tools()).tools}
        wrote = await c.call_tool(
            "notes.quick_write", {"note_id": "N-1", "text": "hi", "author": "alice"}
        )
    assert not wrote.is_error, wrote
    assert [e["tenant"] for e in effects(ledger)] == ["acme"]


async def test_a_frozen_tool_is_a_coded_tool_error_until_unfrozen(mcp_gate: Gate) -> None:
    """ADR 0054: the MCP surface is a translation of the same decision: ``frozen``."""
    from callgate.domain.scope import OPERATOR_ROLE

    operator = mcp_gate.token("olga", [OPERATOR_ROLE], tenant="ops")
    freeze = ["--tool", "notes.read", "--session", operator]
    cg(
        mcp_gate.state_dir,
        "freeze",
        *freeze,
        "--reason",
        "upstream incident",
        profile=mcp_gate.profile,
    )
    async with mcp_gate.client(mcp_gate.token("alice", ALICE_ROLES)) as c:
        wrote = await c.call_tool(
            "notes.quick_write", {"note_id": "N-1", "text": "hello", "author": "alice"}
        )
        assert not wrote.is_error, wrote  # another tool: not frozen
        r = await c.call_tool("notes.read", {"note_id": "N-1"})
        assert r.is_error and outcome(r) == "frozen", r
        assert "upstream incident" in body(r)["error"]["message"]
        cg(mcp_gate.state_dir, "unfreeze", *freeze, profile=mcp_gate.profile)
        again = await c.call_tool("notes.read", {"note_id": "N-1"})
        assert not again.is_error, again
        assert again.structured_content == {"note_id": "N-1", "text": "hello", "author": None}
