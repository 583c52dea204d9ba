"""A call's own session to an upstream MCP server, relaying to the agent (ADR 0075).

A call whose agent takes more than progress (log messages, the upstream's requests) runs
on a session of its own: the shared session cannot tell which call a log message or a
request of the upstream belongs to; a session of one call can. The session:

- speaks the agent's revision, so the upstream asks it as it would ask the agent: with
  requests during the call (2025-11-25) or ``input_required`` results (2026-07-28);
- declares exactly the capabilities the agent declared, and the agent's log level;
- sends each of the upstream's requests to the agent through the call's channel, keyed as
  the upstream keyed them, and hands the answers back, each checked against its request's
  result type. An answer that does not come within the upstream's ``answer_timeout_s``, or
  does not fit, is refused: a 2025-11-25 upstream gets a JSON-RPC error for its request
  and its call decides what to do; in 2026-07-28 rounds the call fails, and nothing was
  applied (the upstream holds no request open between rounds).

Only for an upstream at a URL: a stdio upstream is one process, whose state a second
process would not share (its lookups, C12), so its calls relay progress only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ValidationError

from callgate.providers.channels import Bound, Requests, Unanswered

if TYPE_CHECKING:
    import mcp
    import mcp.types as types

MAX_ROUNDS = 10  # the SDK client's default: an upstream asking more is refused
MRTR = "2026-07-28"  # the first revision without a session's logging level


def result_types() -> dict[str, type[BaseModel]]:
    """The result type of each request an upstream may ask the agent, by method."""
    import mcp.types as types

    return {
        "elicitation/create": types.ElicitResult,
        "sampling/createMessage": types.CreateMessageResult,
        "roots/list": types.ListRootsResult,
    }


async def ask_round(channel: Bound, requests: Requests, timeout_s: float) -> dict[str, Any]:
    """One round of the upstream's requests answered by the agent, each answer typed as
    its request's result; raises ``Unanswered``."""
    if channel.ask is None:
        raise Unanswered("the agent's client takes no requests")
    try:
        answers = await asyncio.wait_for(channel.ask(requests), timeout_s)
    except TimeoutError:
        raise Unanswered(f"the agent did not answer within {timeout_s:g}s") from None
    except Unanswered:
        raise
    except Exception as exc:  # the agent's connection went away while it was asked
        raise Unanswered(f"the agent could not be asked: {exc!r}"[:500]) from exc
    results, typed = result_types(), {}
    for key, request in requests.items():
        body, method = answers.get(key), str(request.get("method"))
        if body is None or method not in results:
            raise Unanswered(f"no answer to the upstream's {key!r}")
        try:
            typed[key] = results[method].model_validate(body)
        except ValidationError as exc:
            raise Unanswered(f"the answer to {key!r} is not a {method} result") from exc
    return typed


async def through_rounds(
    send: Callable[[Any, str | None], Awaitable[Any]], channel: Bound, timeout_s: float
) -> Any:
    """``send`` (a request allowing ``input_required``), its rounds driven until the
    upstream's final result: each round's requests go to the agent, the answers and the
    upstream's ``requestState`` back (SEP-2322, as the SDK client's own driver)."""
    import mcp.types as types

    result = await send(None, None)
    delay = 0.05
    for _ in range(MAX_ROUNDS):
        if not isinstance(result, types.InputRequiredResult):
            return result
        asked = result.input_requests or {}
        responses = None
        if asked:
            requests = {
                key: request.model_dump(by_alias=True, mode="json", exclude_none=True)
                for key, request in asked.items()
            }
            responses, delay = await ask_round(channel, requests, timeout_s), 0.05
        else:  # state only: the upstream is not ready yet
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)
        result = await send(responses, result.request_state)
    raise Unanswered(f"the upstream asked for more than {MAX_ROUNDS} rounds")


def authorized_transport(url: str, authorization: str) -> Any:
    """A streamable-HTTP transport to ``url`` whose every request carries
    ``authorization`` (the call's own token: one session per call)."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": authorization})
    return streamable_http_client(url, http_client=http)


@contextlib.asynccontextmanager
async def relayed(
    url: str, channel: Bound, timeout_s: float, authorization: str | None = None
) -> AsyncIterator[mcp.Client]:
    """The call's own session to the upstream at ``url`` (the module docstring), with the
    call's ``Authorization`` header when its provider obtains one (ADR 0081)."""
    import mcp
    import mcp.types as types
    from mcp.client.session import ClientRequestContext

    async def answer_one(
        method: str, params: BaseModel | None, context: ClientRequestContext
    ) -> Any:
        body = {} if params is None else params.model_dump(by_alias=True, mode="json",
                                                           exclude_none=True)  # fmt: skip
        key = str(context.request_id)
        try:
            answers = await ask_round(channel, {key: {"method": method, "params": body}}, timeout_s)
        except Unanswered as exc:
            return types.ErrorData(code=types.INTERNAL_ERROR, message=str(exc)[:500])
        return answers[key]

    async def elicit(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        return cast("types.ElicitResult", await answer_one("elicitation/create", params, context))

    async def sample(
        context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        answer = await answer_one("sampling/createMessage", params, context)
        return cast("types.CreateMessageResult", answer)

    async def roots(context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
        return cast("types.ListRootsResult", await answer_one("roots/list", None, context))

    log, level, answers = channel.log, channel.log_level, channel.answers

    async def logged(params: types.LoggingMessageNotificationParams) -> None:
        if log is not None:
            log(params.model_dump(by_alias=True, mode="json", exclude_none=True))

    client = mcp.Client(
        url if authorization is None else authorized_transport(url, authorization),
        cache=None,
        mode="auto" if channel.rounds else "legacy",
        elicitation_callback=elicit if "elicitation/create" in answers else None,
        sampling_callback=sample if "sampling/createMessage" in answers else None,
        list_roots_callback=roots if "roots/list" in answers else None,
        logging_callback=logged if log is not None and level is not None else None,
        log_level=cast("types.LoggingLevel | None", level),
    )
    async with client:
        if level is not None and log is not None and (client.session.protocol_version or "") < MRTR:
            # A 2025-11-25 session takes its level once (2026-07-28: per request).
            with contextlib.suppress(mcp.MCPError):
                await client.set_logging_level(cast("types.LoggingLevel", level))
        yield client
