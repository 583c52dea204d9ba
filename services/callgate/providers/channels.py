"""The channel from an upstream's call to the agent waiting for it (ADR 0075).

An agent that asks ``callgate mcp`` for a call opens a channel for the call's invocation
while it waits. The MCP provider that executes that invocation in the same process sends
into it what the upstream sends during the call:

- progress notifications, which the surface forwards under the agent's own token;
- log messages, when the agent asked for them (a logging level);
- the upstream's requests to the client (elicitation, sampling, roots), which the agent
  answers. Only the methods the agent's client declared are asked; the upstream's session
  declares exactly those capabilities.

The channel carries messages and never decides: the decision was taken before the call
ran. It exists only in the process the agent called: a call executed by another process
(a ``callgate serve`` holding the embedded store, a Kafka worker) relays nothing, and the
upstream is told the client has none of these capabilities. Only what the upstream sends
travels, checked: finite progress numbers, a bounded message.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

# progress, total (None: unknown), message (None: none)
Send = Callable[[float, float | None, str | None], None]
# the params of a ``notifications/message`` (level, logger, data)
Log = Callable[[Mapping[str, Any]], None]
# One round of the upstream's requests, by the upstream's keys: {key: {method, params}}
Requests = Mapping[str, Mapping[str, Any]]
# (invocation id, requests) -> the agent's results as JSON, by key; raises ``Unanswered``
Ask = Callable[[str, Requests], Awaitable[dict[str, dict[str, Any]]]]
# An invocation's own ask: requests -> results
BoundAsk = Callable[[Requests], Awaitable[dict[str, dict[str, Any]]]]
MESSAGE_CHARS = 1_000  # an upstream's progress message is cut to this before it travels
# The upstream's requests an agent may be asked, by the client capability that takes them.
ASKS = {
    "elicitation/create": "elicitation",
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
}


class Unanswered(Exception):
    """The agent did not answer an upstream's request (refused, gone, or too slow); the
    upstream receives this as a JSON-RPC error and decides what its call does."""


@dataclass(frozen=True)
class Channel:
    """What reaches the agent of one call. ``answers``: the ``ASKS`` methods the agent's
    client declared; ``log_level``: the level the agent asked for (None: no logs);
    ``rounds``: the agent speaks 2026-07-28, where requests during a call travel as
    ``input_required`` results (the upstream's session of the call speaks what the agent
    speaks, so that an upstream answers it as it would answer the agent)."""

    progress: Send | None = None
    log: Log | None = None
    log_level: str | None = None
    ask: Ask | None = None
    answers: frozenset[str] = frozenset()
    rounds: bool = False  # the agent speaks 2026-07-28: its upstream session does too


@dataclass(frozen=True)
class Bound:
    """A channel as the provider sees it for one invocation: checked, ask bound."""

    progress: Send | None
    log: Log | None
    log_level: str | None
    ask: BoundAsk | None
    answers: frozenset[str]
    rounds: bool

    @property
    def relays(self) -> bool:
        """More than progress: the call needs a session that declares the agent's
        capabilities (progress travels on any session, by its token)."""
        return (self.log is not None and self.log_level is not None) or bool(
            self.answers and self.ask is not None
        )


class Channels:
    """The open channels of this process, by invocation id (thread-safe: the surface opens
    them on its event loop, a runner's thread sends into them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, Channel] = {}

    def open(self, invocation_id: str, channel: Channel) -> None:
        with self._lock:
            self._open[invocation_id] = channel

    def close(self, invocation_id: str) -> None:
        with self._lock:
            self._open.pop(invocation_id, None)

    def of(self, invocation_id: str) -> Bound | None:
        """The channel of ``invocation_id``: progress that is not a finite number is
        dropped, the message cut; asks are of the invocation."""
        with self._lock:
            channel = self._open.get(invocation_id)
        if channel is None:
            return None
        send, ask = channel.progress, channel.ask

        def checked(progress: float, total: float | None, message: str | None) -> None:
            if send is None or not _finite(progress) or (total is not None and not _finite(total)):
                return  # malformed upstream progress: dropped, the call goes on
            text = message[:MESSAGE_CHARS] if isinstance(message, str) else None
            send(float(progress), None if total is None else float(total), text)

        async def asked(requests: Requests) -> dict[str, dict[str, Any]]:
            if ask is None:
                raise Unanswered("the agent's client takes no requests")
            for request in requests.values():
                method = request.get("method")
                if method not in channel.answers:
                    raise Unanswered(f"the agent's client does not take {method}")
            return await ask(invocation_id, requests)

        return Bound(
            progress=None if send is None else checked,
            log=channel.log,
            log_level=channel.log_level,
            ask=None if ask is None else asked,
            answers=channel.answers,
            rounds=channel.rounds,
        )


def _finite(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value == value
        and abs(value) != float("inf")
    )
