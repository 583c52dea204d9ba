"""Resources, prompts, completion and logging through ``callgate mcp`` (ADR 0044).

The same translation as ``tools/call``, not a second decision path:

- ``resources/read`` of a URI is ``Gateway.propose`` of the catalog's ``resources/read``
  entry whose ``uris`` cover it, with ``{"uri": URI}`` as arguments and the URI as the
  target: the decider checks the caller's roles, the arguments against the entry's
  schema, the tenant's ACL on the URI (C2) and records the decision (C1, C9) before the
  upstream is read. ``prompts/get`` is ``Gateway.propose`` of a ``prompts/get`` entry with
  the prompt's arguments. A URI or prompt no entry covers is refused ``unknown_tool``
  (fail closed), and so is a URI two entries cover.
- The lists (``resources/list``, ``resources/templates/list``, ``prompts/list``) are the
  upstreams' own, less everything the session could not read: no entry, a role it lacks,
  or a URI outside its tenant's resources.
- ``completion/complete`` and ``resources/subscribe``/``unsubscribe`` are relayed when the
  session could read what they refer to (same check as the lists); nothing is recorded for
  them, since nothing is read.
- ``logging/setLevel`` is accepted and remembered for the session (what it may be sent).

Refusals are JSON-RPC errors ``-32602`` whose message starts with the vocabulary code and
whose ``data`` carries ``code`` (and ``uri`` or ``invocation_id`` when known). An upstream's
own JSON-RPC error is passed on as it is (``passed_on``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import mcp.types as types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError

from callgate.domain.catalog import ToolSpec
from callgate.domain.codes import Code, Rejection
from callgate.domain.principal import Principal
from callgate.surfaces.mcp.bridge import GatewayBridge
from callgate.surfaces.mcp.channel import Asked, level_of, propose_relayed
from callgate.surfaces.mcp.passed_on import passed_on
from callgate.surfaces.mcp.rounds import Round

MAX_URI = 2048
MAX_SUBSCRIBERS = 1_000  # agent sessions subscribed to one resource
SUCCESS = frozenset({Code.EXECUTED.value, Code.REPLAYED.value})
Ctx = ServerRequestContext[Any, Any]


def refusal(code: str, message: str, **data: Any) -> MCPError:
    return MCPError(types.INVALID_PARAMS, f"{code}: {message}", {"code": code, **data})


def mcp_providers(bridge: GatewayBridge) -> list[Any]:
    """The ``mcp`` providers of the deployment (unwrapped from their timing wrappers)."""
    from callgate.providers.mcp import McpProvider

    found = []
    for wrapped in bridge.app.providers:
        provider = getattr(wrapped, "inner", wrapped)
        if isinstance(provider, McpProvider):
            found.append(provider)
    return found


class Relay:
    """The handlers of the non-tool requests, given how to find the session's principal."""

    def __init__(
        self,
        bridge: GatewayBridge,
        principal_of: Callable[[Ctx], Principal],
        session_of: Callable[[Ctx], str],
        timeout_s: float,
        asked: Asked,
    ) -> None:
        self.bridge = bridge
        self.profile = bridge.app.profile
        self.principal_of = principal_of
        self.session_of = session_of
        self.timeout_s = timeout_s
        self.levels: dict[str, str] = {}  # session -> the logging level it asked for
        self.asked = asked  # reads and prompts whose upstream asks the client (ADR 0075)
        # URI -> the agent sessions subscribed to it, by (connection, token): the session
        # to tell, and the token it subscribed with (checked again at each update).
        self.subscribed: dict[str, dict[tuple[str, str], tuple[Any, str]]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        for provider in mcp_providers(bridge):
            provider.upstream.on_updated.append(self.updated)

    # -- what the catalog offers --------------------------------------------------------

    def entries(self, method: str) -> list[ToolSpec]:
        return [s for s in self.profile.tools.values() if s.upstream_method == method]

    def handlers(self) -> dict[str, Any]:
        """The ``Server`` keyword arguments: only what the catalog serves is announced."""
        out: dict[str, Any] = {}
        resources, prompts = self.entries("resources/read"), self.entries("prompts/get")
        if resources:
            out |= {
                "on_list_resources": self.list_resources,
                "on_list_resource_templates": self.list_templates,
                "on_read_resource": self.read_resource,
                "on_subscribe_resource": self.subscribe,
                "on_unsubscribe_resource": self.unsubscribe,
            }
        if prompts:
            out |= {"on_list_prompts": self.list_prompts, "on_get_prompt": self.get_prompt}
        if resources or prompts:
            out["on_completion"] = self.complete
        if mcp_providers(self.bridge):
            out["on_set_logging_level"] = self.set_level
        return out

    def readable(self, principal: Principal, uri: str) -> ToolSpec | None:
        """The entry through which ``principal`` could read ``uri``, else None."""
        if not isinstance(uri, str) or not uri or len(uri) > MAX_URI:
            return None
        spec = self.profile.resource_entry(uri)
        if spec is None or not principal.has_any_role(spec.callers):
            return None
        return spec if self.profile.owner_of(uri) == principal.tenant else None

    def may_use_template(self, principal: Principal, template: str) -> bool:
        """A template an entry covers and the principal may read through; the tenant's ACL
        applies to each URI when it is read."""
        spec = self.profile.resource_entry(template) if len(template) <= MAX_URI else None
        return spec is not None and principal.has_any_role(spec.callers)

    # -- upstream calls, off the event loop ------------------------------------------------

    async def upstream(self, provider: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        for p in mcp_providers(self.bridge):
            if p.name == provider:
                try:
                    result: dict[str, Any] = await asyncio.to_thread(
                        p.upstream.request, method, params
                    )
                except MCPError:
                    raise
                except Exception as exc:
                    raise MCPError(types.INTERNAL_ERROR, f"{provider}: {exc!r}") from None
                return result
        raise refusal(Code.UNKNOWN_TOOL.value, f"no mcp provider {provider!r}")

    async def each_upstream(self, method: str) -> list[tuple[str, dict[str, Any]]]:
        """``method`` on every mcp upstream that serves it (one page each)."""
        out = []
        for p in mcp_providers(self.bridge):
            try:
                out.append((p.name, await asyncio.to_thread(p.upstream.request, method, {})))
            except Exception:  # an upstream without the feature lists nothing
                continue
        return out

    # -- resources ---------------------------------------------------------------------------

    async def list_resources(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        principal = self.principal_of(ctx)
        listed = [
            r
            for _, page in await self.each_upstream("resources/list")
            for r in page.get("resources", [])
            if self.readable(principal, str(r.get("uri", ""))) is not None
        ]
        return types.ListResourcesResult.model_validate({"resources": listed})

    async def list_templates(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        principal = self.principal_of(ctx)
        listed = [
            t
            for _, page in await self.each_upstream("resources/templates/list")
            for t in page.get("resourceTemplates", [])
            if self.may_use_template(principal, str(t.get("uriTemplate", "")))
        ]
        return types.ListResourceTemplatesResult.model_validate({"resourceTemplates": listed})

    async def read_resource(
        self, ctx: Ctx, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        uri = str(params.uri)
        if len(uri) > MAX_URI:
            raise refusal(Code.INVALID_ARGUMENTS.value, f"a URI has at most {MAX_URI} characters")
        spec = self.profile.resource_entry(uri)
        if spec is None:
            raise refusal(
                Code.UNKNOWN_TOOL.value, "no catalog entry covers this resource URI", uri=uri
            )
        answer = await self.propose(ctx, spec.name, {"uri": uri}, params)
        if isinstance(answer, types.InputRequiredResult):
            return answer
        return types.ReadResourceResult.model_validate(
            {"contents": answer["result"].get("contents", []), "_meta": _meta(answer)}
        )

    async def _subscription(self, ctx: Ctx, method: str, uri: str) -> types.EmptyResult:
        """Subscribe or unsubscribe the agent's session; the upstream is subscribed while
        one session is, and each update goes to the sessions that may still read it."""
        spec = self.readable(self.principal_of(ctx), uri)
        if spec is None:
            raise refusal(
                Code.TOOL_FORBIDDEN.value, "this session may not read this resource", uri=uri
            )
        self.loop = asyncio.get_running_loop()
        connection, token = _connection_of(ctx), self.session_of(ctx)
        if connection is None:
            raise refusal(
                Code.INVALID_ARGUMENTS.value, "a subscription needs a session (Mcp-Session-Id)"
            )
        agent = (connection, token)  # only its own subscription: not another token's
        sessions = self.subscribed.get(uri, {})
        if method == "resources/subscribe":
            if len(sessions) >= MAX_SUBSCRIBERS and agent not in sessions:
                raise refusal(Code.RATE_LIMITED.value, "too many subscriptions to this resource")
            if not sessions:
                await self.upstream(spec.provider, method, {"uri": uri})
            self.subscribed.setdefault(uri, {})[agent] = (ctx.session, token)
        else:
            sessions.pop(agent, None)
            if not sessions:
                self.subscribed.pop(uri, None)
                await self.upstream(spec.provider, method, {"uri": uri})
        return types.EmptyResult()

    def updated(self, uri: str) -> None:
        """From an upstream's thread: ``uri`` changed (``notifications/resources/updated``)."""
        if self.loop is not None and isinstance(uri, str) and len(uri) <= MAX_URI:
            asyncio.run_coroutine_threadsafe(self._tell(uri), self.loop)

    async def _tell(self, uri: str) -> None:
        """Each session subscribed to ``uri`` (or to what it is part of) that may still
        read it is told; one whose session no longer verifies, or that is gone, is
        dropped."""
        app = self.bridge.app
        for subscribed, sessions in list(self.subscribed.items()):
            if uri != subscribed and not uri.startswith(subscribed.rstrip("/") + "/"):
                continue
            for key, (agent, token) in list(sessions.items()):
                try:
                    principal = app.session_verifier.verify(token, app.clock())
                    if self.readable(principal, uri) is not None:
                        await agent.send_resource_updated(uri)
                except Exception:  # an expired session, a closed connection: unsubscribed
                    sessions.pop(key, None)

    async def subscribe(self, ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        return await self._subscription(ctx, "resources/subscribe", str(params.uri))

    async def unsubscribe(
        self, ctx: Ctx, params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        return await self._subscription(ctx, "resources/unsubscribe", str(params.uri))

    # -- prompts -----------------------------------------------------------------------------

    async def list_prompts(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        principal = self.principal_of(ctx)
        listed = []
        for provider, page in await self.each_upstream("prompts/list"):
            for prompt in page.get("prompts", []):
                spec = self.profile.prompt_entry(provider, str(prompt.get("name", "")))
                if spec is not None and principal.has_any_role(spec.callers):
                    listed.append({**prompt, "name": spec.name})
        return types.ListPromptsResult.model_validate({"prompts": listed})

    async def get_prompt(
        self, ctx: Ctx, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        spec = self.profile.tool(params.name)
        if spec is None or spec.upstream_method != "prompts/get":
            raise refusal(Code.UNKNOWN_TOOL.value, f"no catalog entry for prompt {params.name!r}")
        answer = await self.propose(ctx, spec.name, dict(params.arguments or {}), params)
        if isinstance(answer, types.InputRequiredResult):
            return answer
        result = answer["result"]
        return types.GetPromptResult.model_validate(
            {
                "description": result.get("description"),
                "messages": result.get("messages", []),
                "_meta": _meta(answer),
            }
        )

    # -- completion and logging --------------------------------------------------------------

    async def complete(self, ctx: Ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
        principal = self.principal_of(ctx)
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            spec = self.profile.tool(ref.name)
            if (
                spec is None
                or spec.upstream_method != "prompts/get"
                or not principal.has_any_role(spec.callers)
            ):
                raise refusal(Code.UNKNOWN_TOOL.value, f"no prompt {ref.name!r} for this session")
            upstream_ref: dict[str, Any] = {"type": "ref/prompt", "name": spec.upstream_name}
        else:
            found = self.profile.resource_entry(ref.uri) if len(ref.uri) <= MAX_URI else None
            if found is None or not self.may_use_template(principal, ref.uri):
                raise refusal(Code.UNKNOWN_TOOL.value, "no resource template for this session")
            spec, upstream_ref = found, {"type": "ref/resource", "uri": ref.uri}
        body = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        body["ref"] = upstream_ref
        result = await self.upstream(spec.provider, "completion/complete", body)
        return types.CompleteResult.model_validate(result)

    async def set_level(self, ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
        self.principal_of(ctx)  # an unusable session is refused, as everywhere
        self.levels[self.session_of(ctx)] = params.level
        return types.EmptyResult()

    # -- the decision ------------------------------------------------------------------------

    async def propose(
        self,
        ctx: Ctx,
        tool: str,
        args: dict[str, Any],
        params: types.ReadResourceRequestParams | types.GetPromptRequestParams,
    ) -> dict[str, Any] | types.InputRequiredResult:
        """``Gateway.propose`` with the request's channel (ADR 0075); anything but an
        executed read is a coded JSON-RPC error. A 2026-07-28 client may be asked the
        upstream's requests first (``input_required``); its retry continues the call."""
        session, meta = self.session_of(ctx), params.meta or {}
        who: tuple[str, str] | None = None
        try:
            principal = self.principal_of(ctx)
        except MCPError:  # the decider answers an unusable session, coded, as always
            pass
        else:
            who = (principal.tenant, principal.user)
        try:
            if params.request_state is not None and who is not None:  # sealed by the boundary
                state = Round.load(params.request_state)
                resumed = await self.asked.resume(
                    ctx, who, state, params.input_responses or {}, meta
                )
                if resumed is None:  # no longer waiting here: what came of it
                    resumed = await self.bridge.run(
                        lambda g: g.wait(state.invocation_id, session, self.timeout_s)
                    )
                if isinstance(resumed, types.InputRequiredResult):
                    return resumed
                answer = resumed
            else:
                since_ms = self.bridge.app.clock()
                level = level_of(ctx, meta, self.levels.get(session))
                found, asking = await propose_relayed(
                    ctx, meta, level, who,
                    lambda channel: self.bridge.propose(
                        session, tool, args, None, None, self.timeout_s, channel=channel
                    ),
                )  # fmt: skip
                if asking is not None:
                    meta_out = {"callgate/invocation_id": asking.invocation_id}
                    return self.asked.pause(asking, since_ms, meta_out)
                assert found is not None
                answer = found
        except Rejection as r:
            raise refusal(r.code.value, r.message) from None
        outcome = str(answer.get("outcome"))
        if outcome in SUCCESS and isinstance(answer.get("result"), dict):
            return answer
        if (upstream := passed_on(answer)) is not None:
            raise upstream
        err = answer.get("error") or {"code": outcome, "message": outcome}
        data = {"invocation_id": answer.get("invocation_id"), "outcome": outcome}
        raise refusal(str(err["code"]), str(err["message"]), **data)


def _connection_of(ctx: Ctx) -> str | None:
    """Which agent connection a request came on: its ``Mcp-Session-Id`` over HTTP (none
    on a stateless request), the one stdio connection otherwise."""
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return "stdio"
    given = headers.get("mcp-session-id")
    return str(given) if given else None


def _meta(answer: dict[str, Any]) -> dict[str, Any]:
    return {
        "callgate/invocation_id": answer["invocation_id"],
        "callgate/outcome": answer["outcome"],
    }
