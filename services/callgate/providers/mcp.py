"""A provider that is an upstream MCP server (docs/adr/0019-mcp-gateway.md, C5, C12).

``McpProvider`` maps the provider interface onto the tool calls of an upstream's session
(``mcp_upstream.McpUpstream``: one client session on an event loop of its own thread):

- ``dry_run`` calls the catalog entry's ``dry_run_tool`` with the proposed arguments; its
  result (content and structured content) is the snapshot the human confirms (C5). A tool
  without one never gets here: the decider refuses it as ``dry_run_unavailable``.
- ``execute`` calls ``upstream_tool`` with the arguments, callgate's idempotency token and
  the invocation id in the request's ``_meta`` (``callgate/idempotency_key``,
  ``callgate/invocation_id``, ``callgate/tenant``).
- ``lookup`` calls the entry's ``lookup_tool`` with ``{"idempotency_key": token}``; it
  answers with structured content ``{"found": bool, "result": {...}}``. Without a lookup
  tool the provider cannot say, so the outcome stays ``outcome_uncertain`` (never a blind
  retry).

Failures split by what is known about the effect, failing closed: a read timeout or a
lost connection during ``execute`` is ``ProviderTimeout`` (the upstream may have applied
it); an error response, or a result with ``isError``, is ``ProviderError`` (the upstream
answered that it failed); a connection that cannot be opened is ``ProviderError`` because
nothing was sent. An error response is ``UpstreamRefused``, keeping the upstream's code,
message and data for the agent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from callgate.providers.base import (
    DryRunResult,
    ExecutionResult,
    Lookup,
    ProviderError,
    ProviderTimeout,
    UpstreamRefused,
)
from callgate.providers.channels import Bound, Channels, Unanswered
from callgate.providers.mcp_upstream import McpUpstream, UpstreamUnavailable
from callgate.tracing import outgoing

if TYPE_CHECKING:
    import mcp

    from callgate.domain.catalog import ToolSpec

META_IDEMPOTENCY_KEY = "callgate/idempotency_key"
META_INVOCATION_ID = "callgate/invocation_id"
META_TENANT = "callgate/tenant"


class McpProvider:
    """The provider interface over one upstream; ``tools`` are its catalog entries."""

    def __init__(
        self,
        name: str,
        upstream: McpUpstream,
        tools: Mapping[str, ToolSpec],
        channels: Channels | None = None,
    ) -> None:
        """``channels``: this process's channels to the agents waiting for their calls
        (the composition root's; a provider without any relays nothing)."""
        self.name = name
        self.upstream = upstream
        self.tools = dict(tools)
        self.channels = channels if channels is not None else Channels()

    def close(self) -> None:
        self.upstream.close()

    def routing(self, tools: Mapping[str, ToolSpec]) -> McpProvider:
        """This provider with other catalog entries (a policy version's), on the same
        upstream connection (closed by the original)."""
        return McpProvider(self.name, self.upstream, tools, self.channels)

    def _authorization(self) -> str | None:
        """The call's ``Authorization`` value when the upstream takes a token obtained per
        call; ``TokenExchangeFailed`` (nothing sent) when none can be had."""
        tokens = self.upstream.tokens
        return None if tokens is None else tokens.authorization()["Authorization"]

    def _spec(self, tool: str) -> ToolSpec:
        spec = self.tools.get(tool)
        if spec is None:
            raise ProviderError(f"{self.name}: {tool!r} is not one of this upstream's tools")
        return spec

    def dry_run(self, tool: str, target: str, args: Mapping[str, Any], tenant: str) -> DryRunResult:
        spec = self._spec(tool)
        if spec.dry_run_tool is None:
            raise ProviderError(f"{tool} names no dry_run_tool")
        result = self._call(spec.dry_run_tool, args, {META_TENANT: tenant}, effectful=False)
        return DryRunResult(result)

    def execute(
        self,
        tool: str,
        target: str,
        args: Mapping[str, Any],
        tenant: str,
        token: str,
        invocation_id: str,
    ) -> ExecutionResult:
        spec = self._spec(tool)
        meta = {META_IDEMPOTENCY_KEY: token, META_INVOCATION_ID: invocation_id, META_TENANT: tenant}
        channel = self.channels.of(invocation_id)  # the agent waiting in this process, if any
        if spec.upstream_method != "tools/call":  # a read of a resource or a prompt
            return ExecutionResult(self._read(spec, args, channel))
        return ExecutionResult(
            self._call(spec.upstream_name, args, meta, effectful=True, channel=channel)
        )

    def _read(
        self, spec: ToolSpec, args: Mapping[str, Any], channel: Bound | None
    ) -> dict[str, Any]:
        """``resources/read`` or ``prompts/get`` (no effect: any failure is an error)."""
        import mcp

        if spec.upstream_method == "resources/read":
            params: dict[str, Any] = {"uri": args["uri"]}
        else:
            params = {"name": spec.upstream_name, "arguments": dict(args)}
        where = f"{self.name} {spec.upstream_method} {spec.upstream_name}"
        authorization = self._authorization()  # before anything is sent (ADR 0081)
        try:
            return self.upstream.request(spec.upstream_method, params, channel, authorization)
        except UpstreamUnavailable as exc:
            raise ProviderError(str(exc)) from exc
        except Unanswered as exc:  # the upstream waited for the agent: nothing was applied
            raise ProviderError(f"{where}: {exc}") from exc
        except mcp.MCPError as exc:
            raise refused(where, exc) from exc
        except Exception as exc:
            self.upstream.drop()
            raise ProviderError(f"{where}: {exc!r}") from exc

    def lookup(self, token: str, tool: str = "") -> Lookup:
        spec = self._spec(tool)
        if spec.lookup_tool is None:
            raise ProviderError(
                f"{tool} names no lookup_tool: the outcome cannot be reconciled and stays uncertain"
            )
        body = self._call(
            spec.lookup_tool,
            {"idempotency_key": token},
            {META_IDEMPOTENCY_KEY: token},
            effectful=False,
        )
        answer = body.get("structuredContent")
        if not isinstance(answer, dict) or not isinstance(answer.get("found"), bool):
            raise ProviderError(f"{spec.lookup_tool}: answer has no boolean 'found'")
        if not answer["found"]:
            return Lookup(found=False, result=None)
        result = answer.get("result")
        found = result if isinstance(result, dict) else {}
        # Shaped like an execute result, so a reconciled call answers like an executed one.
        text = json.dumps(found, sort_keys=True)
        return Lookup(
            found=True,
            result={"content": [{"type": "text", "text": text}], "structuredContent": found},
        )

    def _call(
        self,
        upstream_tool: str,
        args: Mapping[str, Any],
        meta: Mapping[str, Any],
        *,
        effectful: bool,
        channel: Bound | None = None,
    ) -> dict[str, Any]:
        """One upstream call as a JSON object; ``effectful`` marks execute (doubt: unknown);
        what the upstream sends during it goes to ``channel``."""
        import mcp
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        where = f"{self.name} {upstream_tool}"
        authorization = self._authorization()  # before anything is sent (ADR 0081)
        try:
            # Traced, the upstream continues the call's trace (``traceparent`` in ``_meta``).
            result = self.upstream.call_tool(
                upstream_tool,
                args,
                {**meta, **outgoing()},
                channel=channel,
                authorization=authorization,
            )
        except UpstreamUnavailable as exc:
            raise ProviderError(str(exc)) from exc
        except Unanswered as exc:  # the upstream waited for the agent: nothing was applied
            raise ProviderError(f"{where}: {exc}") from exc
        except mcp.MCPError as exc:
            if exc.code in (REQUEST_TIMEOUT, CONNECTION_CLOSED):
                if exc.code == CONNECTION_CLOSED:
                    self.upstream.drop()  # a timed-out session stays usable
                if effectful:
                    raise ProviderTimeout(f"{where}: {exc.message}, outcome unknown") from exc
                raise ProviderError(f"{where}: {exc.message}") from exc
            # A JSON-RPC error is the upstream refusing the request: nothing ran (ADR 0075).
            raise refused(where, exc) from exc
        except Exception as exc:  # transport broke mid-call, or an unreadable result
            self.upstream.drop()
            if effectful:
                raise ProviderTimeout(f"{where}: {exc!r}, outcome unknown") from exc
            raise ProviderError(f"{where}: {exc!r}") from exc
        body = tool_result_json(result)
        if result.is_error:
            raise ProviderError(f"{where}: the upstream reported an error: {_text(body)}")
        return body


# The codes an event can keep (Avro ``long``); JSON-RPC sets no bound of its own.
_CODES = range(-(2**63), 2**63)


def refused(where: str, exc: mcp.MCPError) -> ProviderError:
    """The failure of an upstream's JSON-RPC error: its code, message and data kept
    (``UpstreamRefused``), unless the code is too large to record."""
    if exc.code not in _CODES:
        return ProviderError(f"{where}: upstream JSON-RPC error {exc.code}: {exc.message}")
    return UpstreamRefused(where, exc.code, exc.message, exc.data)


def tool_result_json(result: mcp.types.CallToolResult) -> dict[str, Any]:
    """The parts of a tool result callgate records: content blocks and structured content."""
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    out: dict[str, Any] = {"content": dumped.get("content", [])}
    if "structuredContent" in dumped:
        out["structuredContent"] = dumped["structuredContent"]
    return out


def _text(body: Mapping[str, Any]) -> str:
    parts = [b.get("text", "") for b in body.get("content", []) if isinstance(b, dict)]
    return " ".join(p for p in parts if p)[:500] or "(no message)"
