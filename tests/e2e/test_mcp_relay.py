"""What an upstream sends during a call reaches the agent, and the answers go back
(issue 28 part 2; ADR 0075), with the official SDK client against ``callgate mcp --http``
in front of an upstream at a URL.

``notes.sign`` asks the client who signs (an elicitation: during the call for a
2025-11-25 client, an ``input_required`` result for a 2026-07-28 one), logs the signer,
then signs once. Each path ends with exactly one effect; refused answers execute nothing.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp
import mcp.types as types
import pytest
import yaml
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from tools.ports import free_ports, wait_port

from callgate.bootstrap import Settings, bootstrap
from tests.e2e.helpers import CALLGATE, cli_env
from tests.mcp_support import UPSTREAM, effects, write_profile

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
SIGN = {
    "description": "Sign a note; the upstream asks who signs.",
    "provider": "notes",
    "upstream_tool": "sign_note",
    "mutation": True,
    "impact": "low",
    "require_dry_run": False,
    "confirmation": "none",
    "target_arg": "note_id",
    "callers": ["support"],
    "args_schema": {
        "type": "object",
        "required": ["note_id"],
        "properties": {"note_id": {"type": "string", "pattern": "^G?N-[0-9]+$"}},
        "additionalProperties": False,
    },
}


@dataclass
class Relay:
    url: str
    ledger: Path
    state_dir: Path
    profile: Path

    def token(self, user: str = "alice", tenant: str = "acme") -> str:
        app = bootstrap(Settings(state_dir=self.state_dir, profile=self.profile, dev=True))
        return app.session_issuer.issue(user, tenant, ["support"], app.clock())

    @contextlib.asynccontextmanager
    async def client(self, token: str, **kw: Any) -> AsyncIterator[mcp.Client]:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        transport = streamable_http_client(self.url, http_client=http)
        async with http, mcp.Client(transport, cache=None, **kw) as client:
            yield client

    def signed(self) -> list[dict[str, Any]]:
        return [e for e in effects(self.ledger) if e["tool"] == "sign_note"]


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[Relay]:
    with started(tmp_path, "auto") as found:
        yield found


@pytest.fixture
def legacy_relay(tmp_path: Path) -> Iterator[Relay]:
    """callgate's own session to the upstream on 2025-11-25, which keeps subscriptions."""
    with started(tmp_path, "legacy") as found:
        yield found


@contextlib.contextmanager
def started(tmp_path: Path, mode: str) -> Iterator[Relay]:
    up_port, gw_port = free_ports(2)
    ledger, state = tmp_path / "notes.jsonl", tmp_path / "state"
    state.mkdir()
    profile = write_profile(tmp_path / "profile", ledger, url=f"http://127.0.0.1:{up_port}/mcp")
    doc = yaml.safe_load(profile.read_text())
    doc["tools"]["notes.sign"] = SIGN
    # Room for the refusals a test makes while the upstream's round waits (ADR 0075).
    doc["providers"]["notes"] |= {"timeout_s": 30, "answer_timeout_s": 20, "mode": mode}
    profile.write_text(yaml.safe_dump(doc, sort_keys=False))
    logs = [(tmp_path / name).open("w") for name in ("upstream.log", "mcp.log")]
    upstream = subprocess.Popen(
        [sys.executable, "-P", str(UPSTREAM), "--ledger", str(ledger), "--http",
         f"127.0.0.1:{up_port}"], stdout=logs[0], stderr=subprocess.STDOUT,
    )  # fmt: skip
    gateway = subprocess.Popen(
        [str(CALLGATE), "--state-dir", str(state), "--profile", str(profile), "mcp", "--http",
         f"127.0.0.1:{gw_port}"], stdout=logs[1], stderr=subprocess.STDOUT,
        env={**cli_env(), "CALLGATE_DEV": "1"},
    )  # fmt: skip
    try:
        wait_port(up_port, upstream, tmp_path / "upstream.log")
        wait_port(gw_port, gateway, tmp_path / "mcp.log")
        yield Relay(f"http://127.0.0.1:{gw_port}/mcp", ledger, state, profile)
    finally:
        for proc in (gateway, upstream):
            proc.terminate()
            proc.wait(timeout=20)
        for log in logs:
            log.close()
        assert "Traceback" not in (tmp_path / "mcp.log").read_text()


async def signs_ada(context: ClientRequestContext, params: types.ElicitRequestParams) -> Any:
    assert params.message == "Who signs N-7?"
    return types.ElicitResult(action="accept", content={"name": "Ada"})


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_a_2025_11_25_agent_answers_the_upstreams_elicitation_and_gets_its_logs(
    relay: Relay,
) -> None:
    logs: list[types.LoggingMessageNotificationParams] = []

    async def logged(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async with relay.client(
        relay.token(), mode="legacy", elicitation_callback=signs_ada, logging_callback=logged
    ) as c:
        await c.set_logging_level("info")
        result = await c.call_tool("notes.sign", {"note_id": "N-7"})
    assert not result.is_error, result
    assert result.structured_content == {"note_id": "N-7", "signer": "Ada"}
    assert [log.data for log in logs] == ["N-7 signed by Ada"]
    assert [(e["note_id"], e["signer"]) for e in relay.signed()] == [("N-7", "Ada")]


async def test_a_2026_07_28_agent_answers_through_input_required_rounds(relay: Relay) -> None:
    async with relay.client(relay.token(), elicitation_callback=signs_ada) as c:
        assert c.session.protocol_version == "2026-07-28"
        result = await c.call_tool("notes.sign", {"note_id": "N-7"})
    assert not result.is_error, result
    assert result.structured_content == {"note_id": "N-7", "signer": "Ada"}
    assert len(relay.signed()) == 1


async def test_the_round_is_sealed_and_bound_and_unfit_answers_are_refused(relay: Relay) -> None:
    """A tampered state, another principal's, or an answer that is not an elicitation
    result: each refused with a code, nothing signed; then the right answer signs once."""
    alice = relay.token()
    async with relay.client(alice, elicitation_callback=signs_ada) as c:
        paused = await c.session.call_tool(
            "notes.sign", {"note_id": "N-7"}, allow_input_required=True
        )
        assert isinstance(paused, types.InputRequiredResult)
        assert set(paused.input_requests or {}) == {"signer"}  # the upstream's own key
        state = paused.request_state
        assert state and "N-7" not in state  # sealed: callgate's state, not the upstream's
        meta = paused.meta or {}
        assert str(meta.get("callgate/invocation_id", "")).count(".") == 1

        ada = {"signer": types.ElicitResult(action="accept", content={"name": "Ada"})}
        tampered = state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")
        with pytest.raises(mcp.MCPError) as refused:
            await c.session.call_tool(
                "notes.sign", {"note_id": "N-7"}, input_responses=ada,  # type: ignore[arg-type]
                request_state=tampered, allow_input_required=True,
            )  # fmt: skip
        assert refused.value.code == types.INVALID_PARAMS

        roots = {"signer": types.ListRootsResult(roots=[])}
        with pytest.raises(mcp.MCPError) as unfit:
            await c.session.call_tool(
                "notes.sign", {"note_id": "N-7"}, input_responses=roots,  # type: ignore[arg-type]
                request_state=state, allow_input_required=True,
            )  # fmt: skip
        assert unfit.value.message.startswith("invalid_arguments:")
        assert relay.signed() == []

    async with relay.client(relay.token("mallory"), elicitation_callback=signs_ada) as m:
        with pytest.raises(mcp.MCPError) as other:
            await m.session.call_tool(
                "notes.sign", {"note_id": "N-7"}, input_responses=ada,  # type: ignore[arg-type]
                request_state=state, allow_input_required=True,
            )  # fmt: skip
        assert other.value.code == types.INVALID_PARAMS
    assert relay.signed() == []

    async with relay.client(alice, elicitation_callback=signs_ada) as c:
        done = await c.session.call_tool(
            "notes.sign", {"note_id": "N-7"}, input_responses=ada,  # type: ignore[arg-type]
            request_state=state, allow_input_required=True,
        )  # fmt: skip
    assert isinstance(done, types.CallToolResult) and not done.is_error, done
    assert done.structured_content == {"note_id": "N-7", "signer": "Ada"}
    assert len(relay.signed()) == 1


async def test_an_agent_without_the_capability_is_not_asked_and_nothing_runs(
    relay: Relay,
) -> None:
    """The upstream's elicitation is refused as the agent's client would refuse it, and the
    upstream's JSON-RPC error that follows is the agent's, as it is (ADR 0085)."""
    async with relay.client(relay.token(), mode="legacy") as c:  # declares no elicitation
        with pytest.raises(mcp.MCPError) as refused:
            await c.call_tool("notes.sign", {"note_id": "N-7"})
    assert refused.value.code == types.INVALID_REQUEST
    assert refused.value.message == "Elicitation not supported"
    assert relay.signed() == []


async def test_an_oversized_nested_or_duplicated_answer_is_refused_at_the_entry(
    relay: Relay,
) -> None:
    """The raw HTTP entry parses strictly: duplicate keys, an oversized body and a deeply
    nested answer are refused before any handler runs."""
    headers = {
        "Authorization": f"Bearer {relay.token()}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
    }
    duplicated = (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"notes.sign",'
        b'"arguments":{"note_id":"N-7"},"inputResponses":{"signer":{"action":"accept"},'
        b'"signer":{"action":"decline"}}}}'
    )
    big = b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"notes.sign",' + (
        b'"arguments":{"note_id":"N-7"},"inputResponses":{"signer":{"action":"accept",'
        b'"content":{"name":"' + b"A" * 3_000_000 + b'"}}}}}'
    )
    deep = (
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"notes.sign",'
        b'"arguments":{"note_id":"N-7"},"inputResponses":{"signer":{"action":"accept",'
        b'"content":' + b'{"a":' * 500 + b"1" + b"}" * 500 + b"}}}}"
    )
    async with httpx.AsyncClient(timeout=30) as http:
        for body in (duplicated, big, deep):
            answer = await http.post(relay.url, content=body, headers=headers)
            assert answer.status_code in (400, 413), answer.text
            assert "error" in answer.json()
    assert relay.signed() == []


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_a_subscribed_agent_is_told_of_an_update_it_may_read(legacy_relay: Relay) -> None:
    """The upstream announces a written note to callgate's subscription; callgate tells
    the agent sessions subscribed to it that may read it, and no other."""
    told: list[str] = []

    async def heard(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            told.append(str(message.params.uri))

    r = legacy_relay
    async with (
        r.client(r.token(), mode="legacy", message_handler=heard) as watcher,
        r.client(r.token("bob"), mode="legacy") as writer,
        r.client(r.token("gus", "globex"), mode="legacy") as other,
    ):
        await watcher.subscribe_resource("notes://N-5")
        with pytest.raises(mcp.MCPError) as refused:  # another tenant's note
            await other.subscribe_resource("notes://N-5")
        assert str(refused.value.message).startswith("tool_forbidden:")
        wrote = await writer.call_tool("notes.quick_write", {"note_id": "N-5", "text": "new"})
        assert not wrote.is_error, wrote
        for _ in range(100):
            if told:
                break
            await anyio.sleep(0.05)
        assert told == ["notes://N-5"]
        await watcher.unsubscribe_resource("notes://N-5")
    subscriptions = [e["tool"] for e in effects(r.ledger) if "subscribe" in e["tool"]]
    assert subscriptions == ["resources/subscribe", "resources/unsubscribe"]
