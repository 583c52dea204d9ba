"""What an upstream may send an agent during a call (``providers.channels``): finite
progress numbers and a bounded message; requests only of the methods the agent's client
declared; anything else is dropped or refused and the call goes on."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from callgate.providers.channels import MESSAGE_CHARS, Channel, Channels, Requests, Unanswered


def progress_channel(sent: list[Any]) -> Channel:
    return Channel(progress=lambda p, t, m: sent.append((p, t, m)))


def test_a_channel_passes_finite_progress_and_cuts_the_message() -> None:
    sent: list[Any] = []
    channels = Channels()
    channels.open("inv-1", progress_channel(sent))
    bound = channels.of("inv-1")
    assert bound is not None and bound.progress is not None
    bound.progress(1, 3, "one")
    bound.progress(2.5, None, "x" * (MESSAGE_CHARS + 50))
    assert sent == [(1.0, 3.0, "one"), (2.5, None, "x" * MESSAGE_CHARS)]


def test_hostile_progress_is_dropped() -> None:
    sent: list[Any] = []
    channels = Channels()
    channels.open("inv-1", progress_channel(sent))
    bound = channels.of("inv-1")
    assert bound is not None and bound.progress is not None
    for progress, total in ((math.nan, 3.0), (math.inf, None), (1.0, -math.inf), (True, 2.0)):
        bound.progress(progress, total, "hostile")
    assert sent == []
    bound.progress(1.0, 2.0, 12345)  # type: ignore[arg-type]  # a message that is not text
    assert sent == [(1.0, 2.0, None)]


def test_a_closed_or_unknown_invocation_has_no_channel() -> None:
    channels = Channels()
    channels.open("inv-1", Channel())
    channels.close("inv-1")
    assert channels.of("inv-1") is None
    assert channels.of("inv-other") is None


def test_progress_alone_needs_no_session_of_its_own() -> None:
    channels = Channels()
    channels.open("inv-1", progress_channel([]))
    bound = channels.of("inv-1")
    assert bound is not None and not bound.relays


def test_asks_go_to_the_agent_with_the_invocation_only_for_declared_methods() -> None:
    asked: list[tuple[str, Requests]] = []

    async def ask(invocation_id: str, requests: Requests) -> dict[str, dict[str, Any]]:
        asked.append((invocation_id, requests))
        return {key: {"action": "accept", "content": {"name": "Ada"}} for key in requests}

    channels = Channels()
    channels.open("inv-1", Channel(ask=ask, answers=frozenset({"elicitation/create"})))
    bound = channels.of("inv-1")
    assert bound is not None and bound.relays and bound.ask is not None
    ask_agent = bound.ask

    async def asking(requests: Requests) -> dict[str, dict[str, Any]]:
        return await ask_agent(requests)

    elicit = {"method": "elicitation/create", "params": {"message": "Name?"}}
    answers = asyncio.run(asking({"user_name": elicit}))
    assert answers["user_name"]["action"] == "accept"
    assert asked == [("inv-1", {"user_name": elicit})]
    sample = {"method": "sampling/createMessage", "params": {"messages": []}}
    with pytest.raises(Unanswered):  # the agent's client did not declare sampling
        asyncio.run(asking({"user_name": elicit, "q": sample}))
    assert len(asked) == 1


def test_a_log_relays_only_with_a_level_the_agent_asked_for() -> None:
    channels = Channels()
    channels.open("inv-1", Channel(log=lambda params: None))
    channels.open("inv-2", Channel(log=lambda params: None, log_level="info"))
    one, two = channels.of("inv-1"), channels.of("inv-2")
    assert one is not None and not one.relays
    assert two is not None and two.relays
