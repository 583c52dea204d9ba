"""One client session to an upstream MCP server (a stdio subprocess or a streamable-HTTP
URL), callable from synchronous code, and its configuration.

The executor is synchronous; the MCP SDK is async. ``McpUpstream`` keeps the session open
on an event loop of its own thread; ``mcp.McpProvider`` maps the provider interface onto
its tool calls. Apart from the provider because the session's life (opening, reopening,
closing, the loop) is one job and the provider's mapping of calls another.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from callgate.providers.channels import Bound
from callgate.providers.upstream_tokens import UpstreamTokenConfig, UpstreamTokens

if TYPE_CHECKING:
    import mcp


T = TypeVar("T")


class McpUpstreamConfig(BaseModel):
    """``providers: {<name>: {kind: mcp, command: [...]}}`` or ``{kind: mcp, url: ...}``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["mcp"]
    command: tuple[str, ...] | None = Field(default=None, min_length=1)
    url: str | None = Field(default=None, pattern=r"^https?://")
    env: dict[str, str] = {}  # added to the SDK's safe default environment of a command
    cwd: str | None = None
    timeout_s: float = Field(default=10.0, gt=0)  # per tool call; then "outcome unknown"
    connect_timeout_s: float = Field(default=20.0, gt=0)
    # How long a request of the upstream during a call (elicitation, sampling, roots) waits
    # for the agent's answer (ADR 0075); the call waits with it, and on the embedded backend
    # so does this process's pipeline. At most 0.8 of ``timeout_s`` is used.
    answer_timeout_s: float = Field(default=8.0, gt=0)
    # The protocol of callgate's session to the upstream: ``auto`` negotiates the newest
    # both speak; ``legacy`` keeps the 2025-11-25 handshake, whose resource subscriptions
    # and logging level the 2026-07-28 revision removed (ADR 0044).
    mode: Literal["auto", "legacy"] = "auto"
    # A token obtained per call for the upstream (ADR 0081): each tool call and read then
    # runs on a session of its own carrying it (a streamable-HTTP upstream only).
    upstream_token: UpstreamTokenConfig | None = None

    @model_validator(mode="after")
    def _one_transport(self) -> McpUpstreamConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of 'command' (stdio) or 'url' (streamable HTTP)")
        if self.upstream_token is not None and self.url is None:
            raise ValueError("upstream_token needs a 'url' upstream (a token travels over HTTP)")
        return self

    @classmethod
    def parse(cls, name: str, body: Mapping[str, Any]) -> McpUpstreamConfig:
        try:
            return cls.model_validate(dict(body))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"]) or "(provider)"
            raise ValueError(f"provider '{name}': field '{loc}': {first['msg']}") from None

    @classmethod
    def from_target(cls, target: str, timeout_s: float = 10.0) -> McpUpstreamConfig:
        """An ad-hoc upstream from a command line (``catalog draft --mcp``): URL or command."""
        if target.startswith(("http://", "https://")):
            return cls(kind="mcp", url=target, timeout_s=timeout_s)
        import shlex

        return cls(kind="mcp", command=tuple(shlex.split(target)), timeout_s=timeout_s)


class UpstreamUnavailable(Exception):
    """The session to the upstream could not be opened (nothing was sent)."""


class McpUpstream:
    """One client session to an upstream MCP server, callable from synchronous code.

    The session lives in one task on a private asyncio loop running in its own thread,
    because the SDK's transports must be entered and left by the same task; calls are
    further tasks on that loop. A broken session is reopened on next use.
    """

    def __init__(
        self, name: str, config: McpUpstreamConfig, tokens: UpstreamTokens | None = None
    ) -> None:
        self.name = name
        self.config = config
        # The call's own token (ADR 0081); the shared session (lists, subscriptions, pins)
        # opens without one.
        self.tokens = tokens
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: mcp.Client | None = None
        self._stop: asyncio.Event | None = None
        self._owner: concurrent.futures.Future[None] | None = None
        # Called, on the session's thread, with the URI of each resource the upstream says
        # was updated (``notifications/resources/updated`` of a subscription).
        self.on_updated: list[Callable[[str], None]] = []

    # -- lifecycle -----------------------------------------------------------------------

    def _connected(self) -> tuple[asyncio.AbstractEventLoop, mcp.Client]:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name=f"mcp-upstream-{self.name}", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            if self._client is None:
                self._open(self._loop)
            assert self._client is not None
            return self._loop, self._client

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the task that owns the session; wait until it is open or has failed."""
        ready = threading.Event()
        failure: list[BaseException] = []

        async def own() -> None:
            try:
                async with self._make_client() as client:
                    self._stop = asyncio.Event()
                    self._client = client
                    ready.set()
                    await self._stop.wait()
            except Exception as exc:
                failure.append(exc)
            finally:
                self._client = None
                ready.set()

        self._owner = asyncio.run_coroutine_threadsafe(own(), loop)
        if not ready.wait(self.config.connect_timeout_s):
            raise UpstreamUnavailable(
                f"{self.name}: no session within {self.config.connect_timeout_s}s"
            )
        if failure or self._client is None:
            why = repr(failure[0]) if failure else "closed while opening"
            raise UpstreamUnavailable(f"{self.name}: cannot connect: {why}")

    def _make_client(self) -> mcp.Client:
        import mcp
        from mcp.client.stdio import get_default_environment

        cfg = self.config
        if cfg.url is not None:
            return mcp.Client(cfg.url, cache=None, mode=cfg.mode, message_handler=self._heard)
        assert cfg.command is not None
        params = mcp.StdioServerParameters(
            command=cfg.command[0],
            args=list(cfg.command[1:]),
            env={**get_default_environment(), **cfg.env},
            cwd=cfg.cwd or os.getcwd(),
        )
        return mcp.Client(params, cache=None, mode=cfg.mode, message_handler=self._heard)

    async def _heard(self, message: Any) -> None:
        """The upstream's notifications on the shared session: resource updates go to
        ``on_updated``; the rest (list changes) is for the SDK's cache, disabled here."""
        import mcp.types as types

        if isinstance(message, types.ResourceUpdatedNotification):
            for listener in list(self.on_updated):
                listener(str(message.params.uri))

    def _close_session(self) -> None:
        """Ask the owner task to leave the session and wait for it (lock held)."""
        loop, stop, owner = self._loop, self._stop, self._owner
        if loop is not None and stop is not None and owner is not None and not owner.done():
            loop.call_soon_threadsafe(stop.set)
            with contextlib.suppress(Exception):
                owner.result(timeout=10)
        self._client = self._stop = self._owner = None

    def close(self) -> None:
        with self._lock:
            self._close_session()
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                if self._thread is not None:
                    self._thread.join(timeout=10)
                self._loop.close()
            self._loop = self._thread = None

    def drop(self) -> None:
        """Forget a session that failed mid-call; the next call reopens it."""
        with self._lock:
            self._close_session()

    # -- calls -----------------------------------------------------------------------------

    def _run(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def list_tools(self) -> list[mcp.types.Tool]:
        loop, client = self._connected()

        async def go() -> list[mcp.types.Tool]:
            tools: list[mcp.types.Tool] = []
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return tools

        return self._run(loop, go())

    @property
    def answer_s(self) -> float:
        """How long the agent's answer to the upstream's request is waited for: below the
        call's own timeout, so that a late answer fails the call, not the session."""
        return min(self.config.answer_timeout_s, 0.8 * self.config.timeout_s)

    def capabilities(self) -> mcp.types.ServerCapabilities:
        """What the upstream announced when the session opened."""
        return self._connected()[1].server_capabilities

    def request(
        self,
        method: str,
        params: Mapping[str, Any],
        channel: Bound | None = None,
        authorization: str | None = None,
    ) -> dict[str, Any]:
        """One request other than ``tools/call`` (lists, reads, prompts, completion,
        logging, subscriptions: ADR 0044), its result as JSON; raises ``mcp.MCPError``.
        A read or a prompt with a ``channel`` that relays runs on a session of its own
        (``mcp_relay``)."""
        import mcp.types as types

        loop, shared = self._connected()
        p = dict(params)

        async def go() -> Any:
            own = channel is not None and channel.relays and self.config.url is not None
            if own and method in ("resources/read", "prompts/get"):
                assert channel is not None
                return await self._on_own(channel, on_own, authorization)
            if authorization is not None:
                return await self._on_authorized(authorization, on)
            return await on(shared)

        async def on_own(client: mcp.Client) -> Any:
            """A read or a prompt, its ``input_required`` rounds relayed to the agent."""
            from callgate.providers.mcp_relay import through_rounds

            assert channel is not None

            async def send(responses: Any, state: str | None) -> Any:
                if method == "resources/read":
                    return await client.session.read_resource(
                        str(p["uri"]), input_responses=responses, request_state=state,
                        allow_input_required=True,
                    )  # fmt: skip
                return await client.session.get_prompt(
                    str(p["name"]), p.get("arguments") or None, input_responses=responses,
                    request_state=state, allow_input_required=True,
                )  # fmt: skip

            return await through_rounds(send, channel, self.answer_s)

        async def on(client: mcp.Client) -> Any:
            cursor = p.get("cursor")
            if method == "resources/list":
                return await client.list_resources(cursor=cursor, cache_mode="bypass")
            if method == "resources/templates/list":
                return await client.list_resource_templates(cursor=cursor, cache_mode="bypass")
            if method == "prompts/list":
                return await client.list_prompts(cursor=cursor, cache_mode="bypass")
            if method == "resources/read":
                return await client.read_resource(str(p["uri"]), cache_mode="bypass")
            if method == "prompts/get":
                return await client.get_prompt(str(p["name"]), p.get("arguments") or None)
            if method == "resources/subscribe":
                return await client.subscribe_resource(str(p["uri"]))
            if method == "resources/unsubscribe":
                return await client.unsubscribe_resource(str(p["uri"]))
            if method == "logging/setLevel":
                return await client.set_logging_level(p["level"])
            if method == "completion/complete":
                ref = p["ref"]
                ref_model: types.PromptReference | types.ResourceTemplateReference = (
                    types.PromptReference.model_validate(ref)
                    if ref.get("type") == "ref/prompt"
                    else types.ResourceTemplateReference.model_validate(ref)
                )
                context = (p.get("context") or {}).get("arguments")
                return await client.complete(ref_model, p["argument"], context)
            raise ValueError(f"{method} is not relayed")

        result = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(go(), self.config.timeout_s), loop
        ).result()
        dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return dumped

    def call_tool(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        meta: Mapping[str, Any],
        channel: Bound | None = None,
        authorization: str | None = None,
    ) -> mcp.types.CallToolResult:
        """One ``tools/call``; raises ``mcp.MCPError`` or a transport error as the SDK does.
        The upstream's progress of this call goes to ``channel``; a channel that relays
        more runs the call on a session of its own (``mcp_relay``)."""
        loop, shared = self._connected()
        report = None if channel is None else channel.progress

        async def progressed(progress: float, total: float | None, message: str | None) -> None:
            if report is not None:
                report(progress, total, message)

        async def on(client: mcp.Client) -> mcp.types.CallToolResult:
            return await client.call_tool(
                tool,
                dict(arguments),
                read_timeout_seconds=self.config.timeout_s,
                progress_callback=None if report is None else progressed,
                meta=cast("mcp.types.RequestParamsMeta", dict(meta)),
            )

        async def on_own(client: mcp.Client) -> mcp.types.CallToolResult:
            from callgate.providers.mcp_relay import through_rounds

            assert channel is not None

            async def send(responses: Any, state: str | None) -> Any:
                return await client.session.call_tool(
                    tool,
                    dict(arguments),
                    read_timeout_seconds=self.config.timeout_s,
                    progress_callback=None if report is None else progressed,
                    input_responses=responses,
                    request_state=state,
                    meta=cast("mcp.types.RequestParamsMeta", dict(meta)),
                    allow_input_required=True,
                )

            result: mcp.types.CallToolResult = await through_rounds(send, channel, self.answer_s)
            return result

        async def go() -> mcp.types.CallToolResult:
            if channel is not None and channel.relays and self.config.url is not None:
                return await self._on_own(channel, on_own, authorization)
            if authorization is not None:
                return await self._on_authorized(authorization, on)
            return await on(shared)

        return self._run(loop, go())

    async def _on_own(
        self,
        channel: Bound,
        on: Callable[[mcp.Client], Awaitable[T]],
        authorization: str | None = None,
    ) -> T:
        """``on`` on the call's own session (``mcp_relay.relayed``); its failure raised as
        it is, not wrapped in the exception group of the session's task group."""
        from callgate.providers.mcp_relay import relayed

        assert self.config.url is not None
        failed: Exception | None = None
        async with relayed(self.config.url, channel, self.answer_s, authorization) as own:
            try:
                return await on(own)
            except Exception as exc:
                failed = exc
        raise failed

    async def _on_authorized(
        self, authorization: str, on: Callable[[mcp.Client], Awaitable[T]]
    ) -> T:
        """``on`` on a session of its own whose requests carry the call's token, bounded
        like the shared session's opening plus the call (a hang is a ``TimeoutError``)."""
        import mcp

        from callgate.providers.mcp_relay import authorized_transport

        assert self.config.url is not None
        failed: Exception | None = None
        transport = authorized_transport(self.config.url, authorization)
        async with asyncio.timeout(self.config.connect_timeout_s + self.config.timeout_s):
            async with mcp.Client(transport, cache=None, mode=self.config.mode) as own:
                try:
                    return await on(own)
                except Exception as exc:
                    failed = exc
        raise failed
