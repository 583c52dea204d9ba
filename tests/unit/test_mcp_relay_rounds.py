"""The rounds of an upstream's ``input_required`` as callgate drives them for the agent
(``providers.mcp_relay``): one round reaches the agent whole, under the upstream's keys;
the answers go back typed, with the upstream's own state; anything the agent does not
answer properly fails the call as ``Unanswered``."""

from __future__ import annotations

import asyncio
from typing import Any

import mcp.types as types
import pytest

from callgate.providers.channels import Bound, Requests, Unanswered
from callgate.providers.mcp_relay import MAX_ROUNDS, ask_round, through_rounds

ELICIT = {"method": "elicitation/create", "params": {"message": "Name?",
          "requestedSchema": {"type": "object", "properties": {}}}}  # fmt: skip
ROOTS = {"method": "roots/list", "params": {}}
ANSWERS: dict[str, dict[str, Any]] = {
    "name": {"action": "accept", "content": {"name": "Ada"}},
    "roots": {"roots": []},
}


def channel(answer: Any) -> tuple[Bound, list[Requests]]:
    asked: list[Requests] = []

    async def ask(requests: Requests) -> dict[str, dict[str, Any]]:
        asked.append(requests)
        if isinstance(answer, BaseException):
            raise answer
        if answer == "slow":
            await asyncio.sleep(5)
        return {k: v for k, v in ANSWERS.items() if k in requests} if answer == "fit" else answer

    bound = Bound(progress=None, log=None, log_level=None, ask=ask,
                  answers=frozenset({"elicitation/create", "roots/list"}), rounds=True)  # fmt: skip
    return bound, asked


def paused(requests: dict[str, Any], state: str | None) -> types.InputRequiredResult:
    return types.InputRequiredResult.model_validate(
        {"inputRequests": requests, **({"requestState": state} if state else {})}
    )


def test_a_round_reaches_the_agent_whole_and_goes_back_typed_with_the_upstreams_state() -> None:
    bound, asked = channel("fit")
    sent: list[tuple[Any, str | None]] = []

    async def send(responses: Any, state: str | None) -> Any:
        sent.append((responses, state))
        if len(sent) == 1:
            return paused({"name": ELICIT, "roots": ROOTS}, "upstream-1")
        return "done"

    assert asyncio.run(through_rounds(send, bound, 1.0)) == "done"
    assert [set(r) for r in asked] == [{"name", "roots"}]  # one round, the upstream's keys
    responses, state = sent[1]
    assert state == "upstream-1"
    assert isinstance(responses["name"], types.ElicitResult)
    assert isinstance(responses["roots"], types.ListRootsResult)


def test_a_round_with_state_only_is_retried_without_asking() -> None:
    bound, asked = channel("fit")
    sent: list[tuple[Any, str | None]] = []

    async def send(responses: Any, state: str | None) -> Any:
        sent.append((responses, state))
        return paused({}, "wait") if len(sent) == 1 else "done"

    assert asyncio.run(through_rounds(send, bound, 1.0)) == "done"
    assert asked == [] and sent[1] == (None, "wait")


def test_an_upstream_asking_without_end_is_refused() -> None:
    bound, _ = channel("fit")

    async def send(responses: Any, state: str | None) -> Any:
        return paused({"name": ELICIT}, "again")

    with pytest.raises(Unanswered, match=str(MAX_ROUNDS)):
        asyncio.run(through_rounds(send, bound, 1.0))


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ({}, "no answer"),  # a key left unanswered
        ({"name": {"roots": []}}, "not a elicitation/create result"),  # does not fit
        (ConnectionError("gone"), "could not be asked"),  # the agent went away
        ("slow", "did not answer within"),
    ],
    ids=["missing", "unfit", "gone", "late"],
)
def test_what_the_agent_does_not_answer_properly_is_unanswered(answer: Any, why: str) -> None:
    bound, _ = channel(answer)
    with pytest.raises(Unanswered, match=why):
        asyncio.run(ask_round(bound, {"name": ELICIT}, 0.2))


def test_an_agent_that_takes_no_requests_is_never_asked() -> None:
    bound, asked = channel("fit")
    narrow = Bound(progress=None, log=None, log_level=None, ask=bound.ask,
                   answers=frozenset(), rounds=True)  # fmt: skip
    assert narrow.relays is False  # nothing beyond progress: the shared session serves it
    silent = Bound(progress=None, log=None, log_level=None, ask=None,
                   answers=frozenset(), rounds=True)  # fmt: skip
    with pytest.raises(Unanswered):
        asyncio.run(ask_round(silent, {"n": ELICIT}, 1))
    assert asked == []
