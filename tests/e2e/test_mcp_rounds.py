"""Approvals that resume inside MCP 2026-07-28 (issue 28 part 3; ADR 0065), with the
official SDK client over stdio to ``callgate mcp --hold``.

A high-impact call answers ``input_required``: a sealed ``requestState`` and, for a client
that takes URL elicitations, the approval page. The retry with that state returns the
outcome once a human approved (one effect); a tampered state, or the state sent by another
principal, is refused by the SDK's boundary (``-32602``) and runs nothing. The SDK's own
retry driver completes the call when the approver acts while the user is shown the page.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import mcp
import mcp.types as types
import pytest
from mcp.shared.exceptions import MCPError

from tests.e2e.helpers import CALLGATE, cli_env
from tests.e2e.test_mcp_gateway import ALICE_ROLES, approve_when_pending
from tests.mcp_support import CONSOLE, Gate, MakeMcpGate, effects

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
HOLD_S = 8  # one round: 1 s (ADR 0065: a hold is cut into 8 rounds, 1 s at least)


@pytest.fixture
def stdio_mcp_gate(make_mcp_gate: MakeMcpGate) -> Gate:
    """The notes profile's gate; each client starts ``callgate mcp`` over stdio."""
    return make_mcp_gate("stdio")


@contextlib.asynccontextmanager
async def client(
    stdio_mcp_gate: Gate, token: str, hold_s: float = HOLD_S, **kw: Any
) -> AsyncIterator[mcp.Client]:
    params = mcp.StdioServerParameters(
        command=str(CALLGATE),
        args=[
            *(
                "--state-dir",
                str(stdio_mcp_gate.state_dir),
                "--profile",
                str(stdio_mcp_gate.profile),
            ),
            *("mcp", "--session", token, "--console-url", CONSOLE, "--hold", str(hold_s)),
        ],
        env={**cli_env(), "CALLGATE_DEV": "1"},
    )
    async with mcp.Client(params, cache=None, **kw) as c:
        assert c.session.protocol_version == "2026-07-28"
        yield c


async def url_taken(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept")


async def test_the_retry_with_the_state_returns_the_outcome_and_a_tampered_one_is_refused(
    stdio_mcp_gate: Gate,
) -> None:
    args = {"note_id": "N-rounds", "text": "round trip", "author": "alice"}
    async with client(
        stdio_mcp_gate, stdio_mcp_gate.token("alice", ALICE_ROLES), elicitation_callback=url_taken
    ) as c:
        first = await c.session.call_tool("notes.write", args, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult), first
        assert first.request_state and "N-rounds" not in first.request_state  # sealed
        assert first.input_requests is not None
        asked = first.input_requests["callgate/approval"]
        assert isinstance(asked, types.ElicitRequest)
        page = asked.params
        assert isinstance(page, types.ElicitRequestURLParams)
        assert first.meta is not None
        inv = first.meta["callgate/invocation_id"]
        assert page.url == f"{CONSOLE}/#invocation={inv}"

        # still pending: input_required again, the same invocation, no second proposal
        again = await c.session.call_tool(
            "notes.write", args, request_state=first.request_state, allow_input_required=True
        )
        assert isinstance(again, types.InputRequiredResult), again
        assert again.input_requests is None  # the page was asked for once
        assert again.meta is not None and again.meta["callgate/invocation_id"] == inv

        tampered = first.request_state[:-4] + (
            "AAAA" if first.request_state[-4:] != "AAAA" else "BBBB"
        )
        with pytest.raises(MCPError) as refused:
            await c.session.call_tool("notes.write", args, request_state=tampered)
        assert refused.value.error.code == types.INVALID_PARAMS
        with pytest.raises(MCPError) as other_args:  # bound to the arguments too
            await c.session.call_tool(
                "notes.write", args | {"text": "swapped"}, request_state=first.request_state
            )
        assert other_args.value.error.code == types.INVALID_PARAMS

        assert (
            await anyio.to_thread.run_sync(approve_when_pending, stdio_mcp_gate, "N-rounds") == inv
        )
        done = await c.session.call_tool(
            "notes.write", args, request_state=again.request_state, allow_input_required=True
        )
        assert isinstance(done, types.CallToolResult) and not done.is_error, done
        assert done.meta is not None and done.meta["callgate/invocation_id"] == inv
        assert done.meta["callgate/outcome"] == "executed"

    # another principal replaying alice's state: refused before callgate reads it
    async with client(stdio_mcp_gate, stdio_mcp_gate.token("carol", ALICE_ROLES)) as c:
        with pytest.raises(MCPError) as stranger:
            await c.session.call_tool("notes.write", args, request_state=first.request_state)
        assert stranger.value.error.code == types.INVALID_PARAMS
    assert len(effects(stdio_mcp_gate.ledger, "write_note")) == 1


async def test_the_sdk_driver_completes_the_call_once_the_approver_acts(
    stdio_mcp_gate: Gate,
) -> None:
    """The user is shown the page (URL elicitation); the approver decides while the SDK's
    driver retries with the state: ``call_tool`` returns the upstream's result."""
    args = {"note_id": "N-driver", "text": "driven", "author": "alice"}
    shown: list[str] = []

    async def show_page(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestURLParams)
        shown.append(params.url)
        await anyio.to_thread.run_sync(approve_when_pending, stdio_mcp_gate, "N-driver")
        return types.ElicitResult(action="accept")

    async with client(
        stdio_mcp_gate, stdio_mcp_gate.token("alice", ALICE_ROLES), elicitation_callback=show_page
    ) as c:
        result = await c.call_tool("notes.write", args)
    assert not result.is_error, result
    assert result.structured_content == args
    assert len(shown) == 1 and shown[0].startswith(f"{CONSOLE}/#invocation=")
    assert len(effects(stdio_mcp_gate.ledger, "write_note")) == 1


async def test_past_the_hold_the_answer_says_how_to_resume(stdio_mcp_gate: Gate) -> None:
    """Nobody approves: after the hold the retry answers ``approval_required`` (a tool
    error that names the page), not an endless pause; nothing ran. The shortest hold of
    more than one round (two rounds of 1 s): the test waits out the whole hold."""
    args = {"note_id": "N-late", "text": "late", "author": "alice"}
    token = stdio_mcp_gate.token("alice", ALICE_ROLES)
    async with client(stdio_mcp_gate, token, hold_s=2) as c:
        result = await c.call_tool("notes.write", args)
    assert result.is_error, result
    assert isinstance(result.structured_content, dict)
    assert result.structured_content["outcome"] == "approval_required"
    assert result.structured_content["approve_at"].startswith(f"{CONSOLE}/#invocation=")
    assert effects(stdio_mcp_gate.ledger, "write_note") == []


async def test_the_same_call_again_resumes_its_invocation_without_a_hold(
    stdio_mcp_gate: Gate,
) -> None:
    """Any client, no ``--hold``, no ``_meta``: the same tool with the same arguments from
    the same principal is the same invocation, pending and then executed; other arguments
    are a new proposal (its own approval, V2)."""
    args = {"note_id": "N-again", "text": "again", "author": "alice"}
    async with client(stdio_mcp_gate, stdio_mcp_gate.token("alice", ALICE_ROLES), hold_s=0) as c:
        first = await c.call_tool("notes.write", args)
        assert first.is_error and isinstance(first.structured_content, dict), first
        assert first.structured_content["outcome"] == "approval_required"
        inv = first.structured_content["invocation_id"]
        pending = await c.call_tool("notes.write", args)
        assert isinstance(pending.structured_content, dict)
        assert pending.structured_content["invocation_id"] == inv  # no second proposal
        assert (
            await anyio.to_thread.run_sync(approve_when_pending, stdio_mcp_gate, "N-again") == inv
        )
        done = await c.call_tool("notes.write", args)
        assert not done.is_error, done
        assert done.meta is not None and done.meta["callgate/invocation_id"] == inv
        other = await c.call_tool("notes.write", args | {"text": "changed"})
        assert isinstance(other.structured_content, dict)
        assert other.structured_content["outcome"] == "approval_required"
        assert other.structured_content["invocation_id"] != inv
    assert len(effects(stdio_mcp_gate.ledger, "write_note")) == 1


@pytest.mark.parametrize(
    "state",
    ["", "v1.", "v1." + "A" * 1_000_000, '{"invocation_id": "x", "since_ms": 0}'],
    ids=["empty", "prefix-only", "oversized", "plaintext-forged"],
)
async def test_a_forged_request_state_is_refused_and_runs_nothing(
    stdio_mcp_gate: Gate, state: str
) -> None:
    args = {"note_id": "N-forged", "text": "forged", "author": "alice"}
    async with client(stdio_mcp_gate, stdio_mcp_gate.token("alice", ALICE_ROLES)) as c:
        with pytest.raises(MCPError) as refused:
            await c.session.call_tool("notes.write", args, request_state=state)
    assert refused.value.error.code in (types.INVALID_PARAMS, types.PARSE_ERROR)
    assert effects(stdio_mcp_gate.ledger) == []


async def test_the_same_call_resumes_its_pending_invocation_after_a_restart(
    stdio_mcp_gate: Gate,
) -> None:
    """A host restarts its stdio server (a new ``callgate mcp``, no memory of the call):
    the same call again finds its pending approval in the ``pending`` view and is the
    same invocation; once approved it runs once."""
    args = {"note_id": "N-restart", "text": "restart", "author": "alice"}
    token = stdio_mcp_gate.token("alice", ALICE_ROLES)
    async with client(stdio_mcp_gate, token, hold_s=0) as c:
        first = await c.call_tool("notes.write", args)
        assert isinstance(first.structured_content, dict), first
        assert first.structured_content["outcome"] == "approval_required"
        inv = first.structured_content["invocation_id"]
    async with client(stdio_mcp_gate, token, hold_s=0) as c:  # another process
        again = await c.call_tool("notes.write", args)
        assert isinstance(again.structured_content, dict), again
        assert again.structured_content["outcome"] == "approval_required"
        assert again.structured_content["invocation_id"] == inv  # no second proposal
    async with client(
        stdio_mcp_gate, stdio_mcp_gate.token("mallory", ALICE_ROLES), hold_s=0
    ) as c:  # not her call
        hers = await c.call_tool("notes.write", args)
        assert isinstance(hers.structured_content, dict)
        assert hers.structured_content["invocation_id"] != inv
    assert await anyio.to_thread.run_sync(approve_when_pending, stdio_mcp_gate, "N-restart") == inv
    async with client(stdio_mcp_gate, token, hold_s=0) as c:
        await c.call_tool("notes.write", args)
    assert len(effects(stdio_mcp_gate.ledger, "write_note")) == 1
