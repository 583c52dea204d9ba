"""The agent's end of a call's channel (ADR 0075, ``providers.channels``).

What the upstream sends while the call runs in this process goes to the agent's request:

- progress, under the agent's own ``progressToken``;
- log messages, when the agent asked for a level (``logging/setLevel`` on a 2025-11-25
  session; the ``io.modelcontextprotocol/logLevel`` opt-in of the request on 2026-07-28);
- the upstream's requests (elicitation, sampling, roots), when the agent's client
  declared them. A 2025-11-25 client is sent each as a request related to its call. A
  2026-07-28 client cannot be sent requests during a call: the call answers
  ``input_required`` with them, sealed in a ``requestState`` bound to the invocation
  (``Asking``), and the client's retry carries the answers to the waiting upstream; the
  retry continues the same invocation, it is never a second proposal.

Answers are checked against the request's result type before they travel; an answer that
does not fit is refused with a code and the request stays waiting.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast, get_args

import mcp.types as types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from pydantic import BaseModel, ValidationError

from callgate.domain.codes import Code
from callgate.providers.channels import ASKS, Channel, Requests, Send, Unanswered
from callgate.providers.mcp_relay import result_types
from callgate.surfaces.mcp.rounds import Round, speaks_rounds

Ctx = ServerRequestContext[Any, Any]
LOG_LEVEL = types.LOG_LEVEL_META_KEY  # a 2026-07-28 request's opt-in to log messages
REQUESTS: dict[str, type[BaseModel]] = {
    "elicitation/create": types.ElicitRequest,
    "sampling/createMessage": types.CreateMessageRequest,
    "roots/list": types.ListRootsRequest,
}
RESULTS = result_types()
LOG_CHARS = 16_000  # an upstream's log message data, as JSON, is cut to this
LEVELS = get_args(types.LoggingLevel)


@dataclass
class Agent:
    """The request the agent's call is on now: a 2026-07-28 retry moves the call to the
    retry's request, where its progress and log messages then go."""

    ctx: Ctx
    meta: Mapping[str, Any]


def answers_of(ctx: Ctx) -> frozenset[str]:
    """The upstream requests the agent's client declared it takes."""
    caps = ctx.session.client_capabilities
    if caps is None:
        return frozenset()
    return frozenset(m for m, cap in ASKS.items() if getattr(caps, cap, None) is not None)


def level_of(ctx: Ctx, meta: Mapping[str, Any], asked: str | None) -> str | None:
    """The log level the agent asked for: the request's opt-in (2026-07-28), else its
    session's ``logging/setLevel`` (``asked``); None: it gets no log messages."""
    if speaks_rounds(ctx):
        given = meta.get(LOG_LEVEL)
        return given if given in LEVELS else None
    return asked if asked in LEVELS else None


def agent_channel(
    agent: Agent, level: str | None, asking: Asking | None, progress_token: str | int | None
) -> Channel | None:
    """The channel of the agent's call (None: nothing to relay). ``asking`` takes the
    upstream's requests of a 2026-07-28 client."""
    loop = asyncio.get_running_loop()

    def later(coro: Any) -> None:
        asyncio.run_coroutine_threadsafe(coro, loop)

    progress: Send | None = None
    if progress_token is not None:

        def progress(done: float, total: float | None, message: str | None) -> None:
            ctx, token = agent.ctx, progress_token_of(agent.meta)  # the request it is on now
            if token is None:
                return
            later(
                ctx.session.send_progress_notification(
                    token, progress=done, total=total, message=message,
                    related_request_id=str(ctx.request_id),
                )
            )  # fmt: skip

    def log(params: Mapping[str, Any]) -> None:
        given = params.get("level")
        if given not in LEVELS:
            return  # not a level: dropped, the call goes on
        ctx = agent.ctx
        logger = params.get("logger")
        data = params.get("data")
        text = json.dumps(data, default=str)
        if len(text) > LOG_CHARS:  # an upstream's, bounded
            data = text[:LOG_CHARS]
        later(
            ctx.session.send_log_message(
                level=cast("types.LoggingLevel", given), data=data,
                logger=logger if isinstance(logger, str) else None,
                related_request_id=ctx.request_id,
            )
        )  # fmt: skip

    async def ask(invocation_id: str, requests: Requests) -> dict[str, dict[str, Any]]:
        """Runs on the upstream's loop; the agent is asked on this server's loop."""
        if asking is not None:
            return await asking.ask(invocation_id, requests)
        sent = asyncio.run_coroutine_threadsafe(_requests(agent.ctx, requests), loop)
        return await asyncio.wrap_future(sent)

    answers = answers_of(agent.ctx)
    if asking is None and not agent.ctx.session.can_send_request:
        answers = frozenset()
    if progress is None and level is None and not answers:
        return None
    return Channel(
        progress=progress,
        log=log if level is not None else None,
        log_level=level,
        ask=ask if answers else None,
        answers=answers,
        rounds=speaks_rounds(agent.ctx),
    )


def progress_token_of(meta: Mapping[str, Any]) -> str | int | None:
    """The agent's ``progressToken`` in a request's ``_meta``, when it gave one."""
    given = meta.get("progress_token", meta.get("progressToken"))
    return given if isinstance(given, str | int) and not isinstance(given, bool) else None


async def _requests(ctx: Ctx, requests: Requests) -> dict[str, dict[str, Any]]:
    """The upstream's requests sent to a 2025-11-25 client, related to its call, at once."""
    keys = list(requests)
    answers = await asyncio.gather(
        *(_request(ctx, str(requests[k].get("method")), requests[k].get("params") or {})
          for k in keys)
    )  # fmt: skip
    return dict(zip(keys, answers, strict=True))


async def _request(ctx: Ctx, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    try:
        request = REQUESTS[method].model_validate({"method": method, "params": dict(params)})
        result = await ctx.session.send_request(
            request,  # type: ignore[arg-type]  # one of the ServerRequest members, by method
            RESULTS[method],
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
        )
    except MCPError as exc:
        raise Unanswered(f"the agent answered error {exc.code}: {exc.message}") from exc
    except ValidationError as exc:
        raise Unanswered(f"{method}: {exc.errors()[0]['msg']}") from exc
    dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


class Asking:
    """The upstream's requests of one invocation waiting for a 2026-07-28 client's answers.

    One round at a time, keyed as the upstream keyed it. ``task`` is the call's own
    ``Gateway.propose``, still running while the client answers; a retry waits on it, so
    the call has one answer whichever request carries it.
    """

    def __init__(self, agent: Agent, principal: tuple[str, str]) -> None:
        self.agent = agent
        self.principal = principal
        self.loop = asyncio.get_running_loop()
        self.invocation_id: str | None = None
        self.task: asyncio.Future[dict[str, Any]] | None = None
        self.changed = asyncio.Event()
        self._round: dict[str, dict[str, Any]] = {}  # key -> {method, params}, unanswered
        self._answers: dict[str, dict[str, Any]] = {}
        self._done: concurrent.futures.Future[dict[str, dict[str, Any]]] | None = None

    async def ask(self, invocation_id: str, requests: Requests) -> dict[str, dict[str, Any]]:
        """From the upstream's loop: wait for the client's answers to one round."""
        done: concurrent.futures.Future[dict[str, dict[str, Any]]] = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(self._open, invocation_id, requests, done)
        try:
            return await asyncio.wrap_future(done)
        finally:  # answered, or given up by the upstream's timeout
            self.loop.call_soon_threadsafe(self._close, done)

    def _open(self, invocation_id: str, requests: Requests, done: Any) -> None:
        self.invocation_id = invocation_id
        self._round = {key: dict(request) for key, request in requests.items()}
        self._answers, self._done = {}, done
        self.changed.set()

    def _close(self, done: Any) -> None:
        if self._done is done:
            self._round, self._answers, self._done = {}, {}, None

    def requests(self) -> dict[str, dict[str, Any]]:
        """What the client is asked now: the round's requests not answered yet."""
        return dict(self._round)

    def answer(self, responses: Mapping[str, Any]) -> None:
        """The client's answers, each checked against its request's result type; raises a
        coded ``MCPError`` (nothing answered) when one is not for a waiting request or
        does not fit it. The round goes back to the upstream once all are answered."""
        checked: dict[str, dict[str, Any]] = {}
        for key, response in responses.items():
            request = self._round.get(key)
            if request is None:
                raise _refused(f"no waiting request {key!r} in this call")
            method = str(request.get("method"))
            body = (
                response.model_dump(by_alias=True, mode="json", exclude_none=True)
                if isinstance(response, BaseModel)
                else response
            )
            try:
                fitted = RESULTS[method].model_validate(body)
            except ValidationError as exc:
                raise _refused(f"the answer to {key!r} is not a {method} result: "
                               f"{exc.errors()[0]['msg']}") from None  # fmt: skip
            checked[key] = fitted.model_dump(by_alias=True, mode="json", exclude_none=True)
        for key, body in checked.items():
            del self._round[key]
            self._answers[key] = body
        if not self._round and self._done is not None and not self._done.done():
            self._done.set_result(self._answers)
        self.changed.clear()

    async def next(self) -> dict[str, Any] | None:
        """The call's answer once ``task`` ends, or None as soon as a round waits for the
        client."""
        assert self.task is not None
        while not self.task.done():
            if self._round:
                return None
            changed = asyncio.ensure_future(self.changed.wait())
            either: set[asyncio.Future[Any]] = {self.task, changed}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            self.changed.clear()
        return self.task.result()


async def propose_relayed(
    ctx: Ctx,
    meta: Mapping[str, Any],
    level: str | None,
    principal: tuple[str, str] | None,
    propose: Callable[[Channel | None], Awaitable[dict[str, Any]]],
) -> tuple[dict[str, Any] | None, Asking | None]:
    """``propose`` with the channel of the agent's request: its answer, or (None, the
    ``Asking``) as soon as the upstream asks a 2026-07-28 client something first."""
    agent = Agent(ctx, meta)
    asking = (
        Asking(agent, principal)
        if principal is not None and speaks_rounds(ctx) and answers_of(ctx)
        else None
    )
    proposed = asyncio.ensure_future(
        propose(agent_channel(agent, level, asking, progress_token_of(meta)))
    )
    if asking is None:
        return await proposed, None
    asking.task = proposed
    answer = await asking.next()
    return answer, (asking if answer is None else None)


class Asked:
    """The calls of this server whose upstream waits for their 2026-07-28 client, by
    invocation: the client's retry finds its call here (at most ``limit``, the oldest
    forgotten first; a forgotten call's retry is answered from its status)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._calls: dict[str, Asking] = {}

    def pause(
        self, asking: Asking, since_ms: int, meta: Mapping[str, Any]
    ) -> types.InputRequiredResult:
        """The round as ``input_required``, sealed (by the SDK's boundary) in a state that
        names the invocation."""
        invocation_id = self.hold(asking)
        state = Round(invocation_id, since_ms, asks=True)
        return types.InputRequiredResult.model_validate(
            {"inputRequests": asking.requests(), "requestState": state.dump(), "_meta": dict(meta)}
        )

    def hold(self, asking: Asking) -> str:
        """Keep the waiting call, by its invocation id, for the client's answers."""
        invocation_id = str(asking.invocation_id)
        self._calls[invocation_id] = asking
        while len(self._calls) > self.limit:
            del self._calls[next(iter(self._calls))]
        return invocation_id

    def waiting(self, invocation_id: str, principal: tuple[str, str]) -> Asking | None:
        """The principal's call whose upstream waits for answers now (MCP Tasks, ADR
        0086: a task's ``input_required``), else None."""
        asking = self._calls.get(invocation_id)
        if asking is None or asking.principal != principal or asking.task is None:
            return None
        return None if asking.task.done() or not asking.requests() else asking

    async def resume(
        self,
        ctx: Ctx,
        principal: tuple[str, str],
        state: Round,
        responses: Mapping[str, Any],
        meta: Mapping[str, Any],
        within_s: float | None = None,
    ) -> dict[str, Any] | types.InputRequiredResult | None:
        """A retry with the client's answers: the call's answer, ``input_required`` again
        for its next round, or None when this server holds no such waiting call (the
        caller answers from the invocation's status). Answers that do not fit, or a call
        of another principal, are refused with a code. With ``within_s`` (a tasks client,
        ADR 0086), a call still running after that long answers as not settled: it goes
        on, and its task tells what came of it."""
        asking = self._calls.get(state.invocation_id)
        if asking is None or asking.task is None:
            return None
        if principal != asking.principal:  # the boundary's binding, checked again
            raise _refused(f"no waiting call {state.invocation_id}", Code.NOT_FOUND)
        asking.answer(responses)
        asking.agent.ctx, asking.agent.meta = ctx, meta
        try:
            answer = await asyncio.wait_for(asyncio.shield(asking.next()), within_s)
        except TimeoutError:
            running = Code.ALLOWED.value  # permitted and in progress, not settled
            return {"invocation_id": state.invocation_id, "outcome": running, "settled": False}
        if answer is None:
            return self.pause(asking, state.since_ms, _meta_of(state.invocation_id))
        self._calls.pop(state.invocation_id, None)
        return answer


def _meta_of(invocation_id: str) -> dict[str, Any]:
    return {"callgate/invocation_id": invocation_id}


def _refused(message: str, code: Code = Code.INVALID_ARGUMENTS) -> MCPError:
    return MCPError(types.INVALID_PARAMS, f"{code.value}: {message}", {"code": code.value})
