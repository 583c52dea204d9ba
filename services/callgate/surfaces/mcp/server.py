"""The MCP server: ``tools/list`` and ``tools/call`` translated to the SDK Gateway.

A translation, not a second decision path (STYLE "Surfaces"):

- ``tools/list`` shows the catalog tools whose ``callers`` include one of the session's
  roles: the only tools its principal could be permitted to call (the generated
  ``callers:<tool>`` permit is the only permit; the profile's policies can only narrow
  it). Argument schemas are the catalog's, which the decider validates against.
- ``tools/call`` is ``Gateway.propose``: the session is the bearer token of the HTTP
  request (``Authorization: Bearer``) or the one configured for stdio, never an argument;
  ``callgate/approval_id`` and ``callgate/idempotency_key`` come from the request's
  ``_meta``. ``executed`` and ``replayed`` return the upstream's result; every other
  outcome is a tool error result (``isError``) whose structured content carries the
  ``outcome``, the ``error`` code and message and the ``invocation_id``. A call the
  upstream refused with a JSON-RPC error answers with that error (``passed_on``).
- ``approval_required`` also carries the dry-run and where to approve; when the client
  supports URL-mode elicitation and a console URL is configured, the server asks the user
  to open it. The approval happens there, with the approver's own session.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from callgate.application.answers import final_answer, is_final
from callgate.domain.canonical import canonical_json
from callgate.domain.catalog import Confirmation
from callgate.domain.codes import Code, Rejection
from callgate.domain.principal import Principal
from callgate.surfaces.mcp.bridge import GatewayBridge
from callgate.surfaces.mcp.channel import Asked, level_of, progress_token_of, propose_relayed
from callgate.surfaces.mcp.passed_on import passed_on
from callgate.surfaces.mcp.relay import Relay
from callgate.surfaces.mcp.rounds import Round, boundary, paused, round_s, speaks_rounds
from callgate.surfaces.mcp.tasks import (
    TASK_AFTER_S,
    CreateTaskResult,
    declares_tasks,
    missing_tasks,
    waits,
)
from callgate.surfaces.mcp.tasks import created as task_created
from callgate.surfaces.mcp.tasks import install as install_tasks

META_APPROVAL_ID = "callgate/approval_id"
META_IDEMPOTENCY_KEY = "callgate/idempotency_key"
META_INVOCATION_ID = "callgate/invocation_id"
META_OUTCOME = "callgate/outcome"
SUCCESS = frozenset({Code.EXECUTED.value, Code.REPLAYED.value})
# Calls awaiting approval this process remembers, so the same call again resumes its
# invocation (ADR 0029); past this many the oldest is forgotten (a new proposal, which
# needs its own approval: never a second effect without one).
HELD_CALLS = 10_000
_EXPLAINED = {
    Code.OUTCOME_UNCERTAIN.value: (
        "the provider did not say whether the effect was applied; call again with the same "
        f"arguments and {META_IDEMPOTENCY_KEY} to reconcile it (it never runs twice)"
    ),
}


@dataclass(frozen=True)
class McpOptions:
    """How ``callgate mcp`` serves (CLI flags)."""

    session: str | None = None  # stdio: the configured session token
    console_url: str | None = None  # the approval console (``callgate serve --http``)
    timeout_s: float = 30.0  # how long a tools/call waits for its proposal to settle
    # How long a tools/call that needs approval is held open for its final outcome
    # (ADR 0029); 0 answers approval_required at once.
    hold_s: float = 0.0


def build_server(bridge: GatewayBridge, options: McpOptions) -> Server[Any]:
    app = bridge.app

    held: dict[tuple[str, str, str, str], str] = {}  # the same call -> its invocation
    asked = Asked(HELD_CALLS)  # calls whose upstream asks their 2026-07-28 client (ADR 0075)

    def session_of(ctx: ServerRequestContext[Any, Any]) -> str:
        """C6: the HTTP request's bearer token, else the configured session; never args."""
        request = ctx.request
        headers = getattr(request, "headers", None)
        if headers is not None:
            auth = str(headers.get("authorization", ""))
            scheme, _, token = auth.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
        return options.session or ""

    def principal_of(ctx: ServerRequestContext[Any, Any]) -> Principal:
        try:
            return app.session_verifier.verify(session_of(ctx), app.clock())
        except Rejection as r:
            raise MCPError(types.INVALID_REQUEST, f"{r.code.value}: {r.message}") from None

    def input_schema(name: str) -> dict[str, Any] | None:
        spec = app.profile.tool(name)
        return None if spec is None else spec.args_schema

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        principal = principal_of(ctx)
        tools = [
            types.Tool(
                name=spec.name,
                description=spec.description or None,
                input_schema=spec.args_schema,
                annotations=types.ToolAnnotations(
                    read_only_hint=not spec.mutation,
                    destructive_hint=spec.mutation,
                    idempotent_hint=not spec.mutation,
                ),
            )
            for spec in app.profile.tools.values()
            if principal.has_any_role(spec.callers) and spec.upstream_method == "tools/call"
        ]
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | CreateTaskResult:
        meta: Mapping[str, Any] = params.meta or {}
        tasks = declares_tasks(ctx)  # a call that waits answers a task (settle, ADR 0086)
        if params.request_state is not None:  # verified and unsealed by the boundary
            return await resume_round(ctx, Round.load(params.request_state), params)
        try:
            approval_id = _meta_text(meta, META_APPROVAL_ID)
            key = _meta_text(meta, META_IDEMPOTENCY_KEY)
        except ValueError as exc:
            return _error_result(Code.INVALID_ARGUMENTS.value, str(exc) or "unreadable", None)
        spec = app.profile.tool(params.name)
        if spec is not None and spec.task_support == "required" and not tasks:
            raise missing_tasks()  # ADR 0086: for tasks agents only; nothing proposed
        if spec is not None and spec.upstream_method != "tools/call":  # ADR 0044
            return _error_result(
                Code.UNKNOWN_TOOL.value, f"{params.name} is a {spec.upstream_method} entry", None
            )
        args = params.arguments or {}
        session = session_of(ctx)
        # The same call again from the same principal while its approval is pending or
        # granted resumes that invocation (ADR 0029): no second proposal, no _meta needed.
        same_call: tuple[str, str, str, str] | None = None
        try:
            principal = principal_of(ctx)
        except MCPError:  # the decider answers an unusable session, coded, as always
            pass
        else:
            same_call = (principal.tenant, principal.user, params.name, canonical_json(args))
        answer: dict[str, Any] | None = None
        resumable = held.get(same_call) if same_call is not None else None
        plain = approval_id is None and key is None
        if (
            resumable is None
            and plain
            and same_call is not None
            and spec is not None
            and spec.confirmation_for(args) is not Confirmation.NONE
        ):
            # Held by another process, or by this one before it restarted (a host restarts
            # a stdio server): the pending approval of the same call (ADR 0029).
            resumable = await bridge.run(lambda g: g.resumable(session, params.name, args))
        if resumable is not None and plain:
            status = await bridge.run(lambda g: g.status(resumable, session))
            if status is not None and (not is_final(status) or status["outcome"] in SUCCESS):
                answer = final_answer(resumable, status)
        since_ms = app.clock()
        if answer is None:
            level = level_of(ctx, meta, relay.levels.get(session))
            try:
                answer, asking = await propose_relayed(
                    ctx, meta, level, None if same_call is None else same_call[:2],
                    lambda channel: bridge.propose(
                        session, params.name, args, key, approval_id,
                        min(options.timeout_s, TASK_AFTER_S) if tasks else options.timeout_s,
                        traceparent=_traceparent(meta),
                        trace_attributes={
                            "mcp.method.name": "tools/call",
                            "jsonrpc.request.id": str(ctx.request_id),
                        },
                        channel=channel,
                    ),
                )  # fmt: skip
            except Rejection as r:  # the SDK's entry limits: refused before anything is published
                return _error_result(r.code.value, r.message, None)
            if asking is not None and tasks and app.clock() - since_ms >= TASK_AFTER_S * 1000:
                # ADR 0086: a call that ran a while before its upstream asks is a task that
                # asks; one that asks at once is a round first (SEP-2663's composition)
                asked.hold(asking)
                answer = {"invocation_id": asking.invocation_id, "outcome": Code.ALLOWED.value}
                return task_created(answer, app.clock(), "the upstream asks the client")
            if asking is not None:  # the upstream asks the client first (ADR 0075)
                return asked.pause(asking, since_ms, {META_INVOCATION_ID: asking.invocation_id})
        assert answer is not None
        return await settle(ctx, params, answer, same_call, since_ms)

    def remember(same_call: tuple[str, str, str, str] | None, answer: Mapping[str, Any]) -> None:
        """A call awaiting approval, so the same call again resumes it (ADR 0029)."""
        if answer.get("outcome") != Code.APPROVAL_REQUIRED.value or same_call is None:
            return
        held[same_call] = str(answer["invocation_id"])
        while len(held) > HELD_CALLS:  # the oldest first (dicts keep insertion order)
            del held[next(iter(held))]

    async def settle(
        ctx: ServerRequestContext[Any, Any],
        params: types.CallToolRequestParams,
        answer: dict[str, Any],
        same_call: tuple[str, str, str, str] | None,
        since_ms: int,
    ) -> types.CallToolResult | types.InputRequiredResult | CreateTaskResult:
        """A call's answer to the client: a task when it waits and the client declared
        Tasks (ADR 0086); held while its approval is pending (ADR 0029), paused with
        ``input_required`` on 2026-07-28 (ADR 0065), else its result."""
        if declares_tasks(ctx) and waits(answer):
            remember(same_call, answer)
            invocation_id = str(answer["invocation_id"])
            message = (
                f"waiting for a human's approval at {approve_at(invocation_id)}"
                if answer["outcome"] == Code.APPROVAL_REQUIRED.value
                else f"{answer['outcome']}: the call is in progress"
            )
            return task_created(answer, app.clock(), message)
        session = session_of(ctx)
        rounds = options.hold_s > 0 and speaks_rounds(ctx)
        if answer.get("outcome") == Code.APPROVAL_REQUIRED.value and same_call is not None:
            remember(same_call, answer)
            hold_s = round_s(options.hold_s) if rounds else options.hold_s
            answer = await _hold(ctx, bridge, session, answer, hold_s, params)
            if rounds and not answer.get("final"):  # ADR 0065: the client retries
                state = Round(str(answer["invocation_id"]), since_ms)
                return paused(ctx, state, approve_at(state.invocation_id), ask=True,
                              meta=_meta_of(answer))  # fmt: skip
        return await answered(ctx, answer)

    async def resume_round(
        ctx: ServerRequestContext[Any, Any], state: Round, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult | CreateTaskResult:
        """A 2026-07-28 retry: with the client's answers to the upstream's requests, the
        call goes on (ADR 0075); else wait one round for the invocation's final outcome;
        pending still, ``input_required`` again until the hold is spent (ADR 0065)."""
        session = session_of(ctx)
        if state.asks:
            principal = principal_of(ctx)
            who = (principal.tenant, principal.user)
            resumed = await asked.resume(  # a coded JSON-RPC error for answers that do not fit
                ctx, who, state, params.input_responses or {}, params.meta or {},
                TASK_AFTER_S if declares_tasks(ctx) else None,
            )  # fmt: skip
            if isinstance(resumed, types.InputRequiredResult):
                return resumed
            if resumed is None:  # no longer waiting here: what came of it
                try:
                    resumed = await bridge.run(
                        lambda g: g.wait(state.invocation_id, session, options.timeout_s)
                    )
                except Rejection as r:
                    return _error_result(r.code.value, r.message, None)
                return await answered(ctx, resumed)
            same_call = (*who, params.name, canonical_json(params.arguments or {}))
            return await settle(ctx, params, resumed, same_call, state.since_ms)
        left_s = options.hold_s - (app.clock() - state.since_ms) / 1000
        wait_s = max(0.0, min(round_s(options.hold_s), left_s))
        try:
            answer = await bridge.run(lambda g: g.wait(state.invocation_id, session, wait_s))
        except Rejection as r:
            return _error_result(r.code.value, r.message, None)
        if not answer.get("final") and options.hold_s - (app.clock() - state.since_ms) / 1000 > 0:
            return paused(ctx, state, approve_at(state.invocation_id), ask=False,
                          meta=_meta_of(answer))  # fmt: skip
        return await answered(ctx, answer)

    def approve_at(invocation_id: str) -> str:
        return _approve_at(options, invocation_id)

    async def answered(
        ctx: ServerRequestContext[Any, Any], answer: Mapping[str, Any]
    ) -> types.CallToolResult:
        """The tool result of an answer: the upstream's result, or a coded tool error; the
        upstream's own JSON-RPC error raised as it is."""
        outcome = str(answer["outcome"])
        if answer.get("invocation_id") is None:  # refused before anything was published
            return _error_result(outcome, str(answer["error"]["message"]), None)
        invocation_id = str(answer["invocation_id"])
        if outcome in SUCCESS:
            return _success(answer)
        if (upstream := passed_on(answer)) is not None:
            raise upstream
        if outcome == Code.PENDING_DECISION.value:
            err = answer["error"]
            return _error_result(str(err["code"]), str(err["message"]), answer)
        if not answer.get("settled", True):
            return _error_result(
                Code.TIMEOUT.value,
                f"the call has not settled within {options.timeout_s}s; "
                f"ask `callgate status {invocation_id}`",
                answer,
            )
        if outcome == Code.APPROVAL_REQUIRED.value:
            return await _approval_required(ctx, answer, options)
        if outcome in (Code.APPROVAL_DENIED.value, Code.APPROVAL_EXPIRED.value):
            err = answer["error"]
            return _error_result(str(err["code"]), str(err["message"]), answer)
        err = answer.get("error") or {"code": outcome, "message": _EXPLAINED.get(outcome, outcome)}
        if outcome == Code.LIMIT_EXCEEDED.value:  # ADR 0079: the message says when to retry
            details = err.get("details") or {}
            return _error_result(
                str(err["code"]), str(err["message"]), answer,
                limit=details.get("limit"), retry_after_s=details.get("retry_after_s"),
            )  # fmt: skip
        return _error_result(str(err["code"]), str(err["message"]), answer)

    relay = Relay(bridge, principal_of, session_of, options.timeout_s, asked)
    with warnings.catch_warnings():
        # logging/setLevel is deprecated at 2026-07-28 and served to 2025-11-25 clients
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        server = _server(input_schema, list_tools, call_tool, relay)
    server.middleware.append(boundary(app.request_state_key, options.hold_s, principal_of))
    install_tasks(
        server, bridge, asked, principal_of, session_of, answered, approve_at, options.timeout_s
    )
    return server


def _server(input_schema: Any, list_tools: Any, call_tool: Any, relay: Relay) -> Server[Any]:
    return Server(
        "callgate",
        version=_version(),
        instructions=(
            "Tool calls go through callgate: identity comes from your session, some calls "
            "need a human's approval. On approval_required, wait for the approval and call "
            "again with the same arguments and _meta {'callgate/approval_id': ID}."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        # The transport checks Mcp-Param headers against a tool's schema; give it the
        # catalog's directly rather than a session-dependent tools/list.
        get_tool_input_schema=input_schema,
        **relay.handlers(),
    )


def _traceparent(meta: Mapping[str, Any]) -> str | None:
    """The caller's W3C trace context in ``_meta`` (``traceparent``); one that is not a
    short string starts a new trace instead (a trace context never refuses a call)."""
    value = meta.get("traceparent")
    return value if isinstance(value, str) and len(value) <= 55 else None


def _meta_text(meta: Mapping[str, Any], key: str) -> str | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise ValueError(f"_meta {key!r} must be a non-empty string of at most 4096 characters")
    return value


def _success(answer: Mapping[str, Any]) -> types.CallToolResult:
    """The upstream's own result (content and structured content), as it was recorded."""
    result = answer.get("result") or {}
    content = result.get("content") if isinstance(result, dict) else None
    meta = {META_INVOCATION_ID: answer["invocation_id"], META_OUTCOME: answer["outcome"]}
    if isinstance(content, list):  # an MCP upstream's result
        return types.CallToolResult.model_validate(
            {
                "content": content,
                "structuredContent": result.get("structuredContent"),
                "_meta": meta,
            }
        )
    # A simulated or HTTP provider's result: a JSON object.
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(result, sort_keys=True))],
        structured_content=result,
        _meta=meta,
    )


def _error_result(
    code: str, message: str, answer: Mapping[str, Any] | None, **extra: Any
) -> types.CallToolResult:
    body: dict[str, Any] = {"outcome": code, "error": {"code": code, "message": message}}
    if answer is not None:
        body["outcome"] = answer["outcome"]
        body["invocation_id"] = answer["invocation_id"]
    body.update(extra)
    text = f"{code}: {message}"
    if extra:
        text += "\n" + json.dumps(extra, sort_keys=True)
    meta = {META_OUTCOME: body["outcome"]}
    if answer is not None:
        meta[META_INVOCATION_ID] = answer["invocation_id"]
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content=body,
        is_error=True,
        _meta=meta,
    )


async def _hold(
    ctx: ServerRequestContext[Any, Any],
    bridge: GatewayBridge,
    session: str,
    answer: dict[str, Any],
    hold_s: float,
    params: types.CallToolRequestParams,
) -> dict[str, Any]:
    """Hold the call open while its approval is pending (ADR 0029): ``Gateway.wait`` in
    one-second slices (other calls share the bridge), a progress notification per slice
    when the client gave a ``progressToken``; the final answer, or the current one when
    the hold runs out."""
    invocation_id = str(answer["invocation_id"])
    token = progress_token_of(params.meta or {})
    loop = asyncio.get_running_loop()
    start = loop.time()
    while (left := hold_s - (loop.time() - start)) > 0:
        answer = await bridge.run(lambda g: g.wait(invocation_id, session, min(1.0, left)))
        if answer.get("final"):
            break
        if token is not None:
            await ctx.session.send_progress_notification(
                token,
                progress=round(loop.time() - start, 1),
                total=hold_s,
                message=f"waiting for the approval of {invocation_id}",
                related_request_id=str(ctx.request_id),
            )
    return answer


async def _approval_required(
    ctx: ServerRequestContext[Any, Any], answer: Mapping[str, Any], options: McpOptions
) -> types.CallToolResult:
    invocation_id = str(answer["invocation_id"])
    approve_at = _approve_at(options, invocation_id)
    message = (
        f"this call needs a human's confirmation, given with their own session at "
        f"{approve_at}. "
        + (
            f"It was held {options.hold_s:g}s; call again with the same arguments to "
            "resume waiting (the approved call runs once, ADR 0029)"
            if options.hold_s > 0
            else "Once approved it runs; call again with the same arguments and _meta "
            f'{{"{META_APPROVAL_ID}": <approval id>}} to get its result'
        )
    )
    elicited = None
    if options.console_url and _supports_url_elicitation(ctx):
        result = await ctx.session.elicit_url(
            message=f"Approve {answer.get('invocation_id')} in the callgate console",
            url=approve_at,
            elicitation_id=invocation_id,
            related_request_id=ctx.request_id,
        )
        elicited = result.action
    extra: dict[str, Any] = {"dry_run": answer.get("dry_run"), "approve_at": approve_at}
    if elicited is not None:
        extra["elicitation"] = elicited
    return _error_result(Code.APPROVAL_REQUIRED.value, message, answer, **extra)


def _approve_at(options: McpOptions, invocation_id: str) -> str:
    """Where a human approves: the console's page for the invocation, else the command."""
    if options.console_url:
        return f"{options.console_url.rstrip('/')}/#invocation={invocation_id}"
    return f"callgate approve {invocation_id} --session TOKEN"


def _meta_of(answer: Mapping[str, Any]) -> dict[str, Any]:
    return {META_INVOCATION_ID: answer["invocation_id"], META_OUTCOME: answer["outcome"]}


def _supports_url_elicitation(ctx: ServerRequestContext[Any, Any]) -> bool:
    caps = ctx.session.client_capabilities
    return bool(
        caps is not None
        and caps.elicitation is not None
        and caps.elicitation.url is not None
        and ctx.session.can_send_request
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("callgate")
    except PackageNotFoundError:
        return "0"
