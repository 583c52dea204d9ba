"""MCP Tasks for calls that wait (SEP-2663, ``io.modelcontextprotocol/tasks``; ADR 0086).

A 2026-07-28 client that declares the extension (in its capabilities, or in one request's
``_meta``) gets a task instead of a held or refused call when its ``tools/call`` waits:
for an approval, or because it has not settled within ``TASK_AFTER_S``. The task is the
invocation: ``taskId`` is the invocation id, and nothing about a task lives in this
process, so any ``callgate mcp`` instance answers it and a restart loses nothing.

Following SEP-2848's draft (approval on Tasks), a call waiting for its approval is
``working``; the approval happens out of band (the console, ``callgate approve``) and
never on the MCP wire. ``tasks/get`` is ``Gateway.status`` of the invocation read with the
caller's own session: a task of another tenant, or of another user, is unknown
(``-32602``, ``not_found``), so a task id grants nothing. ``tasks/cancel`` withdraws a
pending approval with ``Gateway.withdraw`` (the decider records it as denied, so the call
never runs); a call already running cannot be withdrawn (``not_pending``). There is no
``tasks/result`` or ``tasks/list`` (removed by SEP-2663): the result is inlined on
``tasks/get``. A task whose upstream asks the client something (ADR 0075) is
``input_required`` with the requests not answered yet; ``tasks/update`` carries answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from pydantic import Field

from callgate.application.answers import final_answer
from callgate.application.client import Gateway
from callgate.domain.codes import Code, Rejection
from callgate.domain.principal import Principal
from callgate.surfaces.mcp.bridge import GatewayBridge
from callgate.surfaces.mcp.channel import Asked
from callgate.surfaces.mcp.rounds import MRTR_SINCE

TASKS = "io.modelcontextprotocol/tasks"
# A call of a tasks client not final within this long answers a task (it waits or runs long).
TASK_AFTER_S = 1.0
POLL_INTERVAL_MS = 1000
# How long ``tasks/get`` lets a call go on before it answers (the task's own progress).
SETTLE_S = 0.2
# How long a task stays readable: the status view keeps an invocation far longer.
TTL_MS = 24 * 3600 * 1000
WITHDRAWN = "withdrawn by the actor (MCP tasks/cancel)"

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]


class TaskRequestParams(types.RequestParams):
    """``tasks/get``, ``tasks/update`` and ``tasks/cancel`` params: the task's id."""

    task_id: str = Field(min_length=1, max_length=256)
    input_responses: dict[str, Any] | None = None


class Task(types.Result):
    """The SEP-2663 ``Task`` fields, flat at the top of a result."""

    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int
    poll_interval_ms: int | None = None


class CreateTaskResult(Task):
    """A ``tools/call`` answered with a task (``resultType: "task"``)."""

    result_type: Literal["task"] = "task"


class DetailedTask(Task):
    """``tasks/get``: the task, and once terminal its inlined ``result`` or ``error``."""

    result_type: Literal["complete"] = "complete"
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    # ``input_required``: what the upstream asks the client, answered with ``tasks/update``
    input_requests: dict[str, Any] | None = None


class GetTaskRequest(types.Request[TaskRequestParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"  # SEP-2663: Mcp-Name carries the task id


class CancelTaskRequest(types.Request[TaskRequestParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    name_param = "taskId"


def declares_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared the extension (session or per request)."""
    if ctx.session.protocol_version < MRTR_SINCE:
        return False  # a task is 2026-07-28 vocabulary: an older wire cannot carry it
    caps = ctx.session.client_capabilities
    return caps is not None and caps.extensions is not None and TASKS in caps.extensions


def waits(answer: Mapping[str, Any]) -> bool:
    """A ``propose`` answer that is a task for a tasks client: an invocation that waits for
    its approval, is not decided yet, or has not settled."""
    if answer.get("invocation_id") is None:
        return False  # refused before anything was published: answered at once
    outcome = answer.get("outcome")
    return (
        outcome in (Code.APPROVAL_REQUIRED.value, Code.PENDING_DECISION.value)
        or not answer.get("settled", True)
        or answer.get("final") is False
    )


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def created(answer: Mapping[str, Any], now_ms: int, message: str) -> CreateTaskResult:
    return CreateTaskResult(
        task_id=str(answer["invocation_id"]),
        status="working",
        status_message=message,
        created_at=_iso(now_ms),
        last_updated_at=_iso(now_ms),
        ttl_ms=TTL_MS,
        poll_interval_ms=POLL_INTERVAL_MS,
        _meta={"callgate/invocation_id": answer["invocation_id"], "callgate/outcome": "task"},
    )


def _unknown(task_id: str) -> MCPError:
    """One refusal for a task that does not exist and one that is not the caller's."""
    return MCPError(
        types.INVALID_PARAMS,
        f"{Code.NOT_FOUND.value}: no task {task_id}",
        {"code": Code.NOT_FOUND.value},
    )


def missing_tasks() -> MCPError:
    """``-32021``: the request needs the extension declared (SEP-2575, SEP-2663)."""
    data = types.MissingRequiredClientCapabilityErrorData(
        required_capabilities=types.ClientCapabilities(extensions={TASKS: {}})
    )
    return MCPError(
        types.MISSING_REQUIRED_CLIENT_CAPABILITY,
        f"declare the {TASKS} extension to use tasks",
        data.model_dump(by_alias=True, exclude_none=True),
    )


def _check_name_header(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    """SEP-2663 extends SEP-2243's ``Mcp-Name`` to ``tasks/*``: over HTTP it must carry
    the ``taskId`` (the SDK checks it for the core methods only); else ``-32020``."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return  # stdio: no headers to compare
    if decode_header_value(headers.get(MCP_NAME_HEADER)) != task_id:
        raise MCPError(
            types.HEADER_MISMATCH,
            f"{MCP_NAME_HEADER} header does not match the request body's 'taskId' parameter",
        )


Answered = Callable[[ServerRequestContext[Any, Any], Mapping[str, Any]], Awaitable[Any]]


def install(
    server: Server[Any],
    bridge: GatewayBridge,
    asked: Asked,
    principal_of: Callable[[ServerRequestContext[Any, Any]], Principal],
    session_of: Callable[[ServerRequestContext[Any, Any]], str],
    answered: Answered,
    approve_at: Callable[[str], str],
    timeout_s: float,
) -> None:
    """Advertise the extension and serve ``tasks/get``, ``tasks/update``, ``tasks/cancel``."""
    server.extensions[TASKS] = {}

    async def read(
        ctx: ServerRequestContext[Any, Any], params: TaskRequestParams
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The task's status and final answer, read with the caller's own session."""
        if not declares_tasks(ctx):
            raise missing_tasks()
        _check_name_header(ctx, params.task_id)
        principal = principal_of(ctx)  # a session that does not verify: coded refusal
        session, task_id = session_of(ctx), params.task_id

        def look(g: Gateway) -> tuple[dict[str, Any], dict[str, Any]] | None:
            # A short wait first: with no ``callgate serve``, waiting is what runs the
            # deciders and the executor here (the embedded backend), as for ``status``.
            with contextlib.suppress(Rejection):  # another tenant's: answered below
                g.wait(task_id, session, SETTLE_S)
            status = g.status_or_undecided(task_id, session)
            if status is None or status.get("actor") not in (None, principal.user):
                return None  # a task is its actor's: others get what an unknown id gets
            answer = final_answer(task_id, status)
            answer["final"] = g.is_final(status)
            return status, answer

        try:
            found = await bridge.run(look)
        except Rejection as r:
            raise MCPError(types.INVALID_REQUEST, f"{r.code.value}: {r.message}") from None
        if found is None:
            raise _unknown(task_id)
        return found

    async def get(ctx: ServerRequestContext[Any, Any], params: TaskRequestParams) -> DetailedTask:
        status, answer = await read(ctx, params)
        created_ms = int(status.get("proposed_at") or status.get("updated_at") or 0)
        updated_ms = int(status.get("updated_at") or created_ms)
        task: dict[str, Any] = {
            "task_id": params.task_id,
            "created_at": _iso(created_ms),
            "last_updated_at": _iso(updated_ms),
            "ttl_ms": TTL_MS,
        }
        if not answer.get("final"):
            principal = principal_of(ctx)
            asking = asked.waiting(params.task_id, (principal.tenant, principal.user))
            if asking is not None:  # the upstream waits for the client (ADR 0075)
                return DetailedTask(
                    **task, status="input_required", input_requests=asking.requests(),
                    status_message="the upstream asks the client: answer with tasks/update",
                    poll_interval_ms=POLL_INTERVAL_MS,
                )  # fmt: skip
            pending = (status.get("approval") or {}).get("state") in (None, "pending")
            message = (
                f"waiting for a human's approval at {approve_at(params.task_id)}"
                if answer["outcome"] == Code.APPROVAL_REQUIRED.value and pending
                else f"{answer['outcome']}: the call is in progress"
            )
            return DetailedTask(
                **task, status="working", status_message=message, poll_interval_ms=POLL_INTERVAL_MS
            )
        approval = status.get("approval") or {}
        if answer["outcome"] == Code.APPROVAL_DENIED.value and approval.get(
            "approver"
        ) == status.get("actor"):
            return DetailedTask(**task, status="cancelled", status_message=str(approval["reason"]))
        try:
            result = await answered(ctx, answer)
        except MCPError as upstream:  # the upstream's own JSON-RPC error (ADR 0085)
            error = upstream.error.model_dump(by_alias=True, exclude_none=True)
            return DetailedTask(**task, status="failed", error=error)
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return DetailedTask(**task, status="completed", result=dumped)

    async def update(
        ctx: ServerRequestContext[Any, Any], params: TaskRequestParams
    ) -> types.EmptyResult:
        """The client's answers to what the upstream asks (``input_required``), some or
        all of them; an ack. The approval itself is out of band: nothing to answer."""
        await read(ctx, params)
        principal = principal_of(ctx)
        asking = asked.waiting(params.task_id, (principal.tenant, principal.user))
        if asking is not None and params.input_responses:
            # Answers to requests the task does not wait for are ignored (SEP-2322: what
            # a server does not recognize); one that does not fit its request is refused.
            waiting = asking.requests()
            answers = {k: v for k, v in params.input_responses.items() if k in waiting}
            asking.agent.ctx, asking.agent.meta = ctx, params.meta or {}
            asking.answer(answers)  # a coded error (nothing answered) for one that does not fit
        return types.EmptyResult(result_type="complete")

    async def cancel(
        ctx: ServerRequestContext[Any, Any], params: TaskRequestParams
    ) -> types.EmptyResult:
        """Withdraw the pending approval: the call never runs. A terminal task: an ack."""
        _, answer = await read(ctx, params)
        if answer.get("final"):
            return types.EmptyResult(result_type="complete")
        session = session_of(ctx)
        try:
            await bridge.run(lambda g: g.withdraw(params.task_id, session, WITHDRAWN, timeout_s))
        except (Rejection, TimeoutError) as r:
            _, again = await read(ctx, params)  # decided meanwhile (approved, expired)?
            if again.get("final"):
                return types.EmptyResult(result_type="complete")
            code = r.code.value if isinstance(r, Rejection) else Code.TIMEOUT.value
            raise MCPError(
                types.INVALID_REQUEST,
                f"{code}: the call is no longer waiting for its approval and cannot be "
                f"withdrawn ({r})",
                {"code": code},
            ) from None
        return types.EmptyResult(result_type="complete")

    server.add_request_handler("tasks/get", TaskRequestParams, get)
    server.add_request_handler("tasks/update", TaskRequestParams, update)
    server.add_request_handler("tasks/cancel", TaskRequestParams, cancel)
