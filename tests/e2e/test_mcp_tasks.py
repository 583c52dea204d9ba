"""MCP Tasks for calls that wait (issue 41 item 3; ADR 0086), with the official SDK
client over streamable HTTP to a real ``callgate mcp --http`` and its notes upstream.

A 2026-07-28 agent that declares ``io.modelcontextprotocol/tasks`` gets a task for a call
that needs an approval: ``working`` on ``tasks/get`` until a human approves, then
``completed`` with the upstream's result inlined (one effect). ``tasks/cancel`` withdraws
the pending approval: the task is ``cancelled``, the approver is refused and nothing ever
runs. Another user or tenant cannot read or cancel the task; an agent that did not
declare the extension gets today's ``approval_required`` answer and no task surface.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import mcp
import mcp.types as types
import pytest
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from callgate.surfaces.mcp.tasks import (
    TASKS,
    CancelTaskRequest,
    CreateTaskResult,
    DetailedTask,
    GetTaskRequest,
    TaskRequestParams,
)
from tests.e2e.helpers import EXIT_FAILED, cg, run
from tests.e2e.test_mcp_gateway import ALICE_ROLES, approve_when_pending
from tests.mcp_support import CONSOLE, Gate, MakeMcpGate, effects

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
ARGS = {"text": "held as a task", "author": "alice"}


def add_task_write(doc: dict[str, Any]) -> None:
    """A tool for agents that declared Tasks only."""
    doc["tools"]["notes.task_write"] = {
        **doc["tools"]["notes.quick_write"],
        "task_support": "required",
    }


@pytest.fixture
def task_mcp_gate(make_mcp_gate: MakeMcpGate) -> Gate:
    """The notes profile with ``notes.task_write`` (Tasks required), over HTTP."""
    return make_mcp_gate("http", add_task_write, quiet=False)


async def poll(session: Any, task_id: str) -> DetailedTask:
    """``tasks/get`` until the task is terminal (the SDK client, the task's own poll)."""
    deadline = time.monotonic() + 60
    while True:
        task = await get(session, task_id)
        if task.status not in ("working", "input_required"):
            return task
        assert time.monotonic() < deadline, f"task {task_id} never ended: {task}"
        await anyio.sleep((task.poll_interval_ms or 1000) / 1000)


class Tasks(ClientExtension):
    """The client's side of the extension: declares it, and finishes a task answer by
    polling ``tasks/get`` (what an agent host does while the human decides)."""

    identifier = TASKS

    def claims(self) -> Sequence[ResultClaim[Any]]:
        async def resolve(created: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
            task = await poll(ctx.session, created.task_id)
            assert task.status == "completed" and task.result is not None, task
            return types.CallToolResult.model_validate(task.result)

        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=resolve)]


async def get(session: Any, task_id: str) -> DetailedTask:
    request = GetTaskRequest(params=TaskRequestParams(task_id=task_id))
    result: DetailedTask = await session.send_request(request, DetailedTask)
    return result


async def cancel(session: Any, task_id: str) -> None:
    await session.send_request(
        CancelTaskRequest(params=TaskRequestParams(task_id=task_id)), types.EmptyResult
    )


@contextlib.asynccontextmanager
async def agent(task_mcp_gate: Gate, token: str, tasks: bool = True) -> AsyncIterator[mcp.Client]:
    assert task_mcp_gate.url is not None
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    extensions = [Tasks()] if tasks else []
    async with (
        http,
        mcp.Client(
            streamable_http_client(task_mcp_gate.url, http_client=http),
            cache=None,
            extensions=extensions,
        ) as client,
    ):
        assert client.session.protocol_version == "2026-07-28"
        yield client


async def held_task(c: mcp.Client, note_id: str) -> CreateTaskResult:
    created = await c.session.call_tool(
        "notes.write", {"note_id": note_id, **ARGS}, allow_claimed=True
    )
    assert isinstance(created, CreateTaskResult), created
    assert created.status == "working" and created.ttl_ms > 0
    assert created.status_message is not None and CONSOLE in created.status_message
    return created


async def test_a_held_call_is_a_task_that_completes_once_approved(task_mcp_gate: Gate) -> None:
    async with agent(task_mcp_gate, task_mcp_gate.token("alice", ALICE_ROLES)) as c:
        caps = (await c.session.discover()).capabilities
        assert caps.extensions is not None and TASKS in caps.extensions
        created = await held_task(c, "N-task")
        working = await get(c.session, created.task_id)
        assert working.status == "working" and working.result is None, working
        assert effects(task_mcp_gate.ledger, "write_note") == []
        again = await c.session.call_tool(  # the same call again: the same task
            "notes.write", {"note_id": "N-task", **ARGS}, allow_claimed=True
        )
        assert isinstance(again, CreateTaskResult) and again.task_id == created.task_id
        assert (
            await anyio.to_thread.run_sync(approve_when_pending, task_mcp_gate, "N-task")
            == created.task_id
        )
        done = await poll(c.session, created.task_id)
    assert done.status == "completed" and done.result is not None, done
    result = types.CallToolResult.model_validate(done.result)
    assert not result.is_error and result.structured_content == {"note_id": "N-task", **ARGS}
    assert result.meta is not None and result.meta["callgate/invocation_id"] == created.task_id
    assert len(effects(task_mcp_gate.ledger, "write_note")) == 1


async def test_the_sdk_client_resolves_the_task_while_the_approver_acts(
    task_mcp_gate: Gate,
) -> None:
    """``Client.call_tool`` with the extension: the claim polls the task to its result."""
    async with (
        agent(task_mcp_gate, task_mcp_gate.token("alice", ALICE_ROLES)) as c,
        anyio.create_task_group() as tg,
    ):
        approved: list[str] = []

        async def approver() -> None:
            approved.append(
                await anyio.to_thread.run_sync(approve_when_pending, task_mcp_gate, "N-sdk")
            )

        tg.start_soon(approver)
        result = await c.call_tool("notes.write", {"note_id": "N-sdk", **ARGS})
    assert not result.is_error and result.structured_content == {"note_id": "N-sdk", **ARGS}
    assert result.meta is not None and result.meta["callgate/invocation_id"] == approved[0]
    assert len(effects(task_mcp_gate.ledger, "write_note")) == 1


async def test_a_cancelled_task_never_runs(task_mcp_gate: Gate) -> None:
    async with agent(task_mcp_gate, task_mcp_gate.token("alice", ALICE_ROLES)) as c:
        created = await held_task(c, "N-cancel")
        await cancel(c.session, created.task_id)
        cancelled = await get(c.session, created.task_id)
        assert cancelled.status == "cancelled" and cancelled.result is None, cancelled
        await cancel(c.session, created.task_id)  # a terminal task: the same ack
    bob = task_mcp_gate.token("bob", ["notes-approver"])
    refused = run(
        task_mcp_gate.state_dir, "approve", created.task_id, "--session", bob, rc=EXIT_FAILED
    )
    assert "not_pending" in refused.stdout + refused.stderr
    status = cg(
        task_mcp_gate.state_dir,
        "status",
        created.task_id,
        "--session",
        task_mcp_gate.token("alice", ALICE_ROLES),
    )
    assert status["approval"]["state"] == "denied", status  # withdrawn: the actor's denial
    assert status["approval"]["approver"] == "alice"
    assert effects(task_mcp_gate.ledger, "write_note") == []  # the upstream never saw the call


@pytest.mark.parametrize(
    ("user", "tenant"), [("carol", "acme"), ("mallory", "globex")], ids=["user", "tenant"]
)
async def test_another_session_cannot_read_or_cancel_the_task(
    task_mcp_gate: Gate, user: str, tenant: str
) -> None:
    async with agent(task_mcp_gate, task_mcp_gate.token("alice", ALICE_ROLES)) as c:
        created = await held_task(c, f"N-{user}")
    async with agent(task_mcp_gate, task_mcp_gate.token(user, ALICE_ROLES, tenant)) as other:
        for ask in (get, cancel):
            with pytest.raises(MCPError) as refused:
                await ask(other.session, created.task_id)
            assert refused.value.error.code == types.INVALID_PARAMS
            assert refused.value.error.message.startswith("not_found:")
        with pytest.raises(MCPError) as unknown:  # the very refusal of an unknown id
            await get(other.session, "inv-nothing-here")
        assert unknown.value.error.message == refused.value.error.message.replace(
            created.task_id, "inv-nothing-here"
        )
    async with agent(task_mcp_gate, task_mcp_gate.token("alice", ALICE_ROLES)) as c:
        assert (await get(c.session, created.task_id)).status == "working"  # untouched


async def test_an_agent_without_the_extension_gets_the_answer_of_today(task_mcp_gate: Gate) -> None:
    async with agent(task_mcp_gate, task_mcp_gate.token("alice", ALICE_ROLES), tasks=False) as c:
        result = await c.call_tool("notes.write", {"note_id": "N-plain", **ARGS})
        assert result.is_error and isinstance(result.structured_content, dict), result
        assert result.structured_content["outcome"] == "approval_required"
        invocation_id = result.structured_content["invocation_id"]
        with pytest.raises(MCPError) as refused:
            await get(c.session, invocation_id)
        assert refused.value.error.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert effects(task_mcp_gate.ledger, "write_note") == []


async def test_a_call_that_does_not_wait_is_answered_at_once(task_mcp_gate: Gate) -> None:
    async with agent(task_mcp_gate, task_mcp_gate.token("alice", ALICE_ROLES)) as c:
        result = await c.session.call_tool(
            "notes.quick_write", {"note_id": "N-quick", **ARGS}, allow_claimed=True
        )
    assert isinstance(result, types.CallToolResult) and not result.is_error, result
    assert len(effects(task_mcp_gate.ledger, "write_note")) == 1


async def test_a_tool_for_tasks_agents_refuses_the_others_before_anything_runs(
    task_mcp_gate: Gate,
) -> None:
    """``task_support: required``: ``-32021`` naming the extension, nothing proposed; a
    declaring agent's call that does not wait is answered at once."""
    args = {"note_id": "N-required", **ARGS}
    async with agent(task_mcp_gate, task_mcp_gate.token("alice", ALICE_ROLES), tasks=False) as c:
        with pytest.raises(MCPError) as refused:
            await c.session.call_tool("notes.task_write", args)
    assert refused.value.error.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY
    data = types.MissingRequiredClientCapabilityErrorData.model_validate(refused.value.error.data)
    assert data.required_capabilities.extensions == {TASKS: {}}
    assert effects(task_mcp_gate.ledger) == []
    alice = task_mcp_gate.token("alice", ALICE_ROLES)
    assert (
        cg(task_mcp_gate.state_dir, "audit", "--session", alice, profile=task_mcp_gate.profile)
        == []
    )  # none proposed
    async with agent(task_mcp_gate, alice) as c:
        result = await c.session.call_tool("notes.task_write", args, allow_claimed=True)
    assert isinstance(result, types.CallToolResult) and not result.is_error, result
    assert len(effects(task_mcp_gate.ledger, "write_note")) == 1
    assert (
        len(cg(task_mcp_gate.state_dir, "audit", "--session", alice, profile=task_mcp_gate.profile))
        == 1
    )
